"""torchrun's own failure summary: which global ranks failed on which hosts, their local ranks and exit codes."""

from __future__ import annotations

import re

from ..lines import strip_prefixes
from ..model import MAX_RANKS, Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser, context_field

# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg / _format_failure):
#   [1]:
#     time      : 2024-10-09_21:16:02
#     host      : ault44.cscs.ch
#     rank      : 5 (local_rank: 5)
#     exitcode  : 2 (pid: 1006194)
#     error_file: <N/A>
#     traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
# under "Failures:" and "Root Cause (first observed failure):".
_RANK = re.compile(r"^\s{0,8}rank\s{0,16}: (?P<rank>\d{1,9}) \(local_rank: (?P<local>\d{1,9})\)")
_HOST = re.compile(r"^\s{0,8}host\s{0,16}: (?P<host>\S{1,255})")
_EXIT = re.compile(r"^\s{0,8}exitcode\s{0,8}: (?P<code>-?\d{1,9}) \(pid: (?P<pid>\d{1,10})\)(?:\s{0,8}\((?P<sig>SIG\w{1,16})\))?")

KIND = "torchrun_failures"


class TorchrunSummary(Recogniser):
    """The ranks torchrun reports as failed, with hosts and local ranks: who failed, and how many per node."""

    kinds = (KIND,)
    keywords = ("(local_rank: ", "exitcode  : ")
    patterns = (_RANK, _EXIT)
    help = "torchrun's failure summary (ranks, hosts, exit codes)"
    examples = (
        # ChildFailedError.format_msg, as a job printed it
        Example("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                "============================================================\n"
                "train.py FAILED\n"
                "------------------------------------------------------------\n"
                "Failures:\n"
                "[1]:\n"
                "  time      : 2024-10-09_21:16:02\n"
                "  host      : node2\n"
                "  rank      : 7 (local_rank: 3)\n"
                "  exitcode  : -15 (pid: 1006195)  (SIGTERM)\n"
                "  error_file: <N/A>\n"
                "  traceback : Signal 15 (SIGTERM) received by PID 1006195\n"
                "------------------------------------------------------------\n"
                "Root Cause (first observed failure):\n"
                "[0]:\n"
                "  time      : 2024-10-09_21:16:02\n"
                "  host      : node2\n"
                "  rank      : 5 (local_rank: 1)\n"
                "  exitcode  : 1 (pid: 1006193)\n"
                "  error_file: <N/A>\n"
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
                "============================================================\n",
                KIND, (5, 7), ("rank 7 only stopped by torchrun", "node2: local ranks 1-3")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        m = _RANK.search(line.body)
        if m:
            group = groups(KIND)
            rank, local = line.integer(m, "rank"), line.integer(m, "local")
            if rank is None or local is None:
                group.unreadable("a failed rank")
                group.add(line.number, line.body.strip())
                return True
            host = None
            for _, text in list(line.context)[-3:]:
                field = context_field(text, _HOST, "host", lambda t: strip_prefixes(t)[0])
                if field.found:
                    host = field.value
                    if host is None:
                        group.unreadable("a host")
            group.add(line.number, line.body.strip(), ranks=(rank,))
            failures: dict[int, dict] = group.facts.setdefault("failures", {})
            if rank in failures or len(failures) < MAX_RANKS:
                failures[rank] = {"local": local, "host": host}
            return True
        m = _EXIT.search(line.body)
        if m:
            # its rank is on the line above (read first, so its group exists); an exitcode line alone is no finding
            above = [context_field(text, _RANK, "rank", lambda t: strip_prefixes(t)[0])
                     for _, text in list(line.context)[-2:]]
            rank_line = next((r for r in reversed(above) if r.found), None)
            if rank_line is None:
                return False
            if rank_line.value is None:
                return True  # the rank above is unreadable; its own line said so
            failure = groups(KIND).facts.get("failures", {}).get(int(rank_line.value))
            if failure is not None:
                failure["exit"] = line.integer(m, "code")
                failure["signal"] = m.group("sig")
            return True
        return False

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        failures: dict[int, dict] = group.facts.get("failures", {})
        own = sorted(r for r, f in failures.items() if f.get("signal") not in ("SIGTERM", "SIGKILL"))
        stopped = sorted(r for r in failures if r not in own)
        per_host: dict[str, set[int]] = {}
        for r, f in failures.items():
            per_host.setdefault(f.get("host") or "?", set()).add(f["local"])
        hosts = []
        for name, locals_ in sorted(per_host.items()):
            hosts.append(f"{name}: local ranks {min(locals_)}-{max(locals_)}" if len(locals_) > 1
                         else f"{name}: local rank {min(locals_)}")
        summary = (f"torchrun reports {ranks_phrase(failures)} failed" +
                   (f" ({ranks_phrase(stopped)} only stopped by torchrun after the others failed)" if stopped and own
                    else "") + ".")
        # global rank - local rank is the first global rank of that rank's node; two nodes' offsets give the
        # processes per node
        bases = sorted({r - f["local"] for r, f in failures.items()})
        cause = ("Global ranks count across nodes; the local rank (LOCAL_RANK) counts within one node and is the one "
                 "that selects a GPU.")
        if len(bases) > 1:
            step = bases[1] - bases[0]
            cause += (f" Node offsets {', '.join(map(str, bases[:4]))} (global rank - local rank) point to {step} "
                      f"processes per node, if no node lies between them.")
        elif len(per_host) == 1 and len(failures) > 1:
            n = max(f["local"] for f in failures.values()) + 1
            cause += f" All on one host, local ranks up to {n - 1}: at least {n} processes on that node."
        fix = ("Read the first failure's own traceback above this summary (the root cause is printed last, "
               "under 'Root Cause'); exit code -15 (SIGTERM) marks ranks torchrun stopped because another failed.")
        return Diagnosis(kind, summary, tuple(sorted(failures)), tuple(hosts), cause, fix, group.sorted_evidence(),
                         group.occurrences)
