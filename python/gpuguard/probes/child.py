"""Child side of the GPU probes (python -m gpuguard.probes.child ...): prints one JSON event per line, flushed.

Run only by gpuguard.probes, which holds the deadline: anything here may hang on a broken machine, and that
is exactly what the parent is there to observe.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def probe_p2p(nbytes: int) -> int:
    from .._core import enumerate_devices, peer_copy_probe

    found, error = enumerate_devices()
    if error is not None:
        emit(event="error", message=error.message)
        return 3
    count = len(found)
    emit(event="devices", count=count)
    for src in range(count):
        for dst in range(count):
            if src == dst:
                continue
            emit(event="start", src=src, dst=dst)
            result, error = peer_copy_probe(src, dst, nbytes)
            row = result.as_dict() if result is not None else {"src": src, "dst": dst, "bytes": nbytes}
            emit(event="result", **row, error=error.as_dict() if error is not None else None)
    return 0


def probe_nccl(rank: int, nranks: int, device: int, timeout: float) -> int:
    """One rank of an all-reduce across the local GPUs. Rank 0 makes the unique id and prints it; the parent
    hands it to the other ranks on their standard input."""
    from ..system.nccl_library import nccl_probe, nccl_unique_id

    if rank == 0:
        try:
            unique_id = nccl_unique_id()
        except RuntimeError as exc:
            emit(event="error", stage="ncclGetUniqueId", message=str(exc))
            return 3
        emit(event="unique_id", hex=unique_id.hex())
    else:
        line = sys.stdin.readline()
        try:
            unique_id = bytes.fromhex(line.strip())
        except ValueError:
            emit(event="error", stage="unique id", message=f"the parent sent no unique id ({line[:40]!r})")
            return 3
    emit(event="start", rank=rank, device=device)
    result = nccl_probe(nranks, rank, unique_id, device, timeout, True)
    emit(event="result", rank=rank, device=device, **result.as_dict())
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuguard.probes.child")
    sub = parser.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("p2p")
    p.add_argument("--bytes", type=int, default=8 << 20)
    p = sub.add_parser("nccl")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--nranks", type=int, required=True)
    p.add_argument("--device", type=int, required=True)
    p.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    if args.probe == "p2p":
        return probe_p2p(args.bytes)
    if args.probe == "nccl":
        return probe_nccl(args.rank, args.nranks, args.device, args.timeout)
    return 2  # pragma: no cover - argparse rejects unknown probes


if __name__ == "__main__":
    raise SystemExit(main())
