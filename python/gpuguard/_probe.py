"""Child side of the GPU probes (python -m gpuguard._probe ...): prints one JSON event per line, flushed.

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
    from ._native import _C

    found, error = _C.enumerate_devices()
    if error is not None:
        emit(event="error", message=error["message"])
        return 3
    count = len(found)
    emit(event="devices", count=count)
    for src in range(count):
        for dst in range(count):
            if src == dst:
                continue
            emit(event="start", src=src, dst=dst)
            result = _C.peer_copy_probe(src, dst, nbytes)
            emit(event="result", **result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuguard._probe")
    sub = parser.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("p2p")
    p.add_argument("--bytes", type=int, default=8 << 20)
    args = parser.parse_args(argv)
    if args.probe == "p2p":
        return probe_p2p(args.bytes)
    return 2  # pragma: no cover - argparse rejects unknown probes


if __name__ == "__main__":
    raise SystemExit(main())
