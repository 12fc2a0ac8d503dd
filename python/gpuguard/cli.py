"""The gpuguard command line: `gpuguard devices | doctor | explain | check | run`, each with --json."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Optional, Sequence

Command = Callable[[argparse.Namespace], int]


def cmd_devices(args: argparse.Namespace) -> int:
    from .system.devices import cuda_status, devices

    found = devices()
    status = cuda_status()
    if args.json:
        print(json.dumps({"devices": [d.as_dict() for d in found], "cuda": status.as_dict()}, indent=2))
        return 0
    if not found:
        print(f"No CUDA devices visible: {status.reason or 'the driver reports none'}")
        return 0
    rows = [("index", "name", "uuid", "pci bus id", "memory", "cc")]
    for d in found:
        cc = f"{d.compute_capability[0]}.{d.compute_capability[1]}"
        rows.append((str(d.index), d.name, d.uuid, d.pci_bus_id, f"{d.total_memory_gib:.1f} GiB", cc))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    print(f"driver {status.driver_version_string}, CUDA_VISIBLE_DEVICES="
          f"{status.visible_devices_at_init if status.visible_devices_at_init is not None else '(unset)'}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .logs import LogExplainer, format_diagnoses

    explainer = LogExplainer(match_local=not args.no_local, log_is_local=args.this_host)
    if args.file in (None, "-"):
        if sys.stdin.isatty():
            print("gpuguard explain: reading the error text from the terminal; end it with Ctrl-D "
                  "(or pass a log file: gpuguard explain FILE)", file=sys.stderr)
        explainer.feed_stream(sys.stdin.buffer)
    else:
        try:
            with open(args.file, "rb") as f:
                explainer.feed_stream(f)
        except OSError as exc:
            print(f"gpuguard explain: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    found = explainer.diagnoses()
    if args.json:
        print(json.dumps({"recognised": bool(found), "lines_read": explainer.lines,
                          "diagnoses": [d.as_dict() for d in found]}, indent=2))
    else:
        print(format_diagnoses(found, explainer.lines), end="")
    return 0 if found else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor_report import format_report, run_doctor

    if args.timeout <= 0:
        print(f"gpuguard doctor: --timeout must be a positive number of seconds, not {args.timeout:g}",
              file=sys.stderr)
        return 2
    report = run_doctor(p2p=args.p2p, nccl=args.nccl, timeout=args.timeout)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(format_report(report), end="")
    return report.exit_code


def cmd_check(args: argparse.Namespace) -> int:
    """Pre-flight under the job's own launcher (`torchrun ... -m gpuguard check`): every rank binds and meets
    the others exactly as the training script's bind() would, without loading a model."""
    import logging

    from .binding.steps import preflight
    from .errors import GpuGuardError

    from .whole_lines import write_line

    logging.getLogger("gpuguard").addHandler(logging.NullHandler())
    # every rank writes to the launcher's one stdout: each JSON object (and each report) in one write
    try:
        binding = preflight(group=args.group, timeout=args.timeout, verify_nccl=args.verify_nccl,
                            require_gpu=args.require_gpu, require_exclusive=args.require_exclusive)
    except GpuGuardError as exc:
        if args.json:
            write_line(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
        else:
            write_line(f"gpuguard check failed: {type(exc).__name__}: {exc}", sys.stderr)
        return 1
    if args.json:
        write_line(json.dumps({"ok": True, "binding": binding.as_dict()}, default=str))
    else:
        write_line(str(binding))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .auto.run_command import run

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return run(cmd, args.json_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuguard",
        description="Catch GPU-placement mistakes in multi-GPU PyTorch and Ray jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("devices", help="list the CUDA devices this process can see")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_devices)

    from .logs import HELP as EXPLAINS

    p = sub.add_parser("explain", help="decode an NCCL / PyTorch / Ray error message or a whole log",
                       description="Reads one error message or a whole log (ranks interleaved, launcher "
                                   "prefixes allowed) and explains each failure it recognises: the ranks and "
                                   f"devices involved, the cause and the fix. It recognises: {EXPLAINS}. Exit "
                                   "status: 0 when something was recognised, 1 when nothing was, 2 when the "
                                   "input cannot be read.")
    p.add_argument("file", nargs="?", metavar="FILE", help="the log to read; '-' or nothing reads standard input")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-local", action="store_true",
                   help="do not match NCCL's PCI bus ids to this host's GPUs (leaves the CUDA driver alone)")
    p.add_argument("--this-host", action="store_true",
                   help="the log was written on this machine: its GPUs shape the advice (e.g. a host with one GPU)")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("doctor", help="report on this machine and process, with findings and fixes",
                       description="Versions, launcher environment, CUDA_VISIBLE_DEVICES, devices and peer access, "
                                   "then findings with a severity and a fix. Exit status 1 when a finding is an "
                                   "error. Paste the output into an issue as it is.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--p2p", action="store_true",
                   help="copy between every pair of GPUs and verify the bytes (in a child process, under --timeout)")
    p.add_argument("--nccl", action="store_true",
                   help="run an all-reduce across the local GPUs, and again with NCCL_P2P_DISABLE=1 if it hangs")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="deadline in seconds for each probe (default 30)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("check", help="bind this rank and check placement across the job (run it under the launcher)",
                       description="Run under the job's launcher, e.g. `torchrun --nproc_per_node 8 -m gpuguard "
                                   "check` or `srun python -m gpuguard check`: every rank does what "
                                   "gpuguard.bind() does in a training script (resolve its GPU, meet the other "
                                   "ranks, find shared GPUs) and prints its binding. Exit status 1 on a problem.")
    p.add_argument("--group", default="default", help="the rank group to check (default: default)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="deadline in seconds for the whole check, other ranks and NCCL included (default 60)")
    p.add_argument("--verify-nccl", action="store_true",
                   help="also form a real NCCL communicator of the group and run one all-reduce on it (on a hang, "
                        "again with NCCL_P2P_DISABLE=1, saying whether that cures it)")
    p.add_argument("--require-gpu", action="store_true", help="fail instead of binding the CPU when no GPU is visible")
    p.add_argument("--require-exclusive", action="store_true",
                   help="fail (every rank) when a rank's GPU holds memory of processes outside the job, instead of "
                        "warning")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run a job unchanged with every gpuguard check on (GPUGUARD=1)",
                       description="Runs CMD with GPUGUARD=1: every Python process of the job arms gpuguard's "
                                   "checks when it imports torch (set_device indices, NCCL groups sharing a GPU, "
                                   "device mismatches), e.g. `gpuguard run -- torchrun --nproc_per_node 8 "
                                   "train.py`. Exit status: the command's.")
    p.add_argument("--json-report", metavar="FILE", help="write every rank's binding and verdict to FILE (JSON)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the job's command")
    p.set_defaults(func=cmd_run)

    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `gpuguard ... | head`
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
