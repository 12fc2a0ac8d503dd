"""gpuguard's own stall report (gpuguard.watch()): one JSON object a line, {"gpuguard_stall": {...}}, read tolerantly."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from ..model import MAX_RANKS, Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser

# The shape gpuguard.watch() writes (one line of JSON; any other fields are ignored, any missing one is left out):
#   {"gpuguard_stall": {"kind": "rank_behind" | "rank_slow" | "no_progress" | "desync" | "rank_gone",
#    "group": "dp", "seq": 5653, "op": "ALL_REDUCE", "stuck_ranks": [5], "waiting_ranks": [0, 1, 2, 3, 4, 6, 7],
#    "waited_s": 74, "stack": "..."}}
# A line cut by the reader (a long stack) is not valid JSON; its fields are then read one by one.
_STALL = re.compile(r'"gpuguard_stall"\s{0,8}:\s{0,8}\{')
# The report to its closing brace, or to the end of the text when it does not close there (a report a paste broke
# across lines is joined while this reaches on; one the reader cut is read as far as it goes). No object nests in
# it; every string but a last one cut short is closed, so each piece matches one way only and a failed match
# backtracks in linear time.
_WHOLE = re.compile(r'"gpuguard_stall"\s{0,8}:\s{0,8}\{(?:[^{}"]|"(?:[^"\\]|\\.){0,8192}"){0,4096}'
                    r'(?:\}|"(?:[^"\\]|\\.){0,8192}\\?$|$)')
_STRING_FIELD = re.compile(r'"(?P<key>kind|group|op|stack)"\s{0,8}:\s{0,8}"(?P<value>(?:[^"\\]|\\.){0,8192})"')
_NUMBER_FIELD = re.compile(r'"(?P<key>seq|waited_s)"\s{0,8}:\s{0,8}(?P<value>-?\d{1,19}(?:\.\d{1,9})?)')
_LIST_FIELD = re.compile(r'"(?P<key>stuck_ranks|waiting_ranks)"\s{0,8}:\s{0,8}\[(?P<value>[\d, ]{0,65536})\]?')

KIND = "gpuguard_stall"
STALL_KINDS = {"rank_behind", "rank_slow", "no_progress", "desync", "rank_gone"}


def _fields(body: str, start: int) -> dict[str, Any]:
    """The stall object from its opening brace at ``start``: parsed as JSON, or field by field when it is cut."""
    try:
        value, _ = json.JSONDecoder().raw_decode(body, start)
        if isinstance(value, dict):
            return value
    except ValueError:
        pass
    found: dict[str, Any] = {}
    for m in _STRING_FIELD.finditer(body, start):
        found.setdefault(m.group("key"), _unescape(m.group("value")))
    for m in _NUMBER_FIELD.finditer(body, start):
        found.setdefault(m.group("key"), float(m.group("value")))
    for m in _LIST_FIELD.finditer(body, start):
        found.setdefault(m.group("key"), [int(r) for r in re.split(r"[, ]+", m.group("value")) if r])
    return found


_FIELD_NAMES = {"seq": "the collective's sequence number", "waited_s": "how long they waited",
                "stuck_ranks": "the stuck ranks", "waiting_ranks": "the waiting ranks", "kind": "the kind of stall",
                "group": "the group", "op": "the collective", "stack": "the stack"}


def _unescape(text: str) -> str:
    return text.encode().decode("unicode_escape", "replace")


def _rank_list(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in re.split(r"[, ]+", text) if r)


def _ranks(value: Any) -> list[int]:
    return [r for r in value if isinstance(r, int) and not isinstance(r, bool)][:MAX_RANKS] \
        if isinstance(value, list) else []


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class GpuguardStall(Recogniser):
    """A stall gpuguard's watchdog reported: who is stuck in or behind which collective, for how long, and where."""

    kinds = (KIND,)
    keywords = ('"gpuguard_stall"',)
    patterns = (_WHOLE, _STALL)
    help = "gpuguard's own stall reports (gpuguard.watch)"
    examples = (
        # the JSON line gpuguard.watch() prints on each rank (watchdog/watcher.py), under torch's rank prefix
        Example('[rank0]: {"gpuguard_stall": {"kind": "rank_behind", "group": "dp", "seq": 5653, "op": "ALL_REDUCE", '
                '"stuck_ranks": [5], "waiting_ranks": [0, 1, 2, 3, 4, 6, 7], "waited_s": 74, "stack": "File '
                '\\"train.py\\", line 88, in step"}}\n',
                KIND, (5,), ("ALL_REDUCE #5653 on group 'dp'", "ranks 0, 1, 2, 3, 4, 6, 7 waited in it for 74 s")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        m = _STALL.search(line.body)
        if not m:
            return False
        stall = _fields(line.body, m.end() - 1)
        group = groups(KIND)
        # a number a paste broke across lines counts only when every reading of the break gives it
        for pattern, parse in ((_NUMBER_FIELD, float), (_LIST_FIELD, _rank_list), (_STRING_FIELD, _unescape)):
            for f in pattern.finditer(line.body, m.end() - 1):
                key = f.group("key")
                if key in stall and line.value(f, "value", parse) is None:
                    stall.pop(key)
                    group.unreadable(_FIELD_NAMES[key])
        stuck, waiting = _ranks(stall.get("stuck_ranks")), _ranks(stall.get("waiting_ranks"))
        group.add(line.number, line.body.strip(), ranks=stuck)
        reports: list[dict[str, Any]] = group.facts.setdefault("reports", [])
        if len(reports) < 8:
            kind = stall.get("kind") if stall.get("kind") in STALL_KINDS else None
            reports.append({"kind": kind, "group": stall.get("group") if isinstance(stall.get("group"), str) else None,
                            "seq": _number(stall.get("seq")), "op": stall.get("op") if isinstance(stall.get("op"), str)
                            else None, "stuck": stuck, "waiting": waiting, "waited_s": _number(stall.get("waited_s")),
                            "stack": stall.get("stack") if isinstance(stall.get("stack"), str) else None})
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        reports = group.facts.get("reports", [])
        first = reports[0] if reports else {}
        what = (first.get("op") or "a collective") + (f" #{int(first['seq'])}" if first.get("seq") is not None else "") \
            + (f" on group '{first['group']}'" if first.get("group") else "")
        stuck = ranks_phrase(first.get("stuck") or []) if first.get("stuck") else "a rank"
        waited = f" for {first['waited_s']:g} s" if first.get("waited_s") is not None else ""
        waiting = f"; {ranks_phrase(first['waiting'])} waited in it{waited}" if first.get("waiting") else ""
        stall_kind = first.get("kind")
        if stall_kind == "no_progress":
            summary = f"Every rank entered {what} and nothing completed{waited}."
            cause = ("All ranks are inside the same collective, so the program agrees; the data does not move. That "
                     "is the transport: GPU peer-to-peer or the network between nodes.")
            fix = ("Run `gpuguard doctor --p2p --nccl` on the node; if the all-reduce passes only with "
                   "NCCL_P2P_DISABLE=1, peer-to-peer is broken there (ACS/IOMMU): disable ACS or set the IOMMU to "
                   "passthrough, or run with NCCL_P2P_DISABLE=1 meanwhile.")
        elif stall_kind == "rank_slow":
            summary = f"Every rank entered {what}; {stuck} had not completed it{waited}, though the others had."
            cause = ("The collective completed on the other ranks, so the program agrees and the transport works; the "
                     "named rank's side is behind: its GPU is still running the work queued before it (a long kernel, "
                     "a GPU shared with another process), or its process gets too little CPU (a loaded host).")
            fix = ("Look at what runs on that rank's GPU (nvidia-smi) and at its host's load (top); torch.profiler "
                   "around the steps before the call site shows a long kernel.")
        elif stall_kind == "desync":
            summary = f"The ranks disagree on the collective at the same point ({what}): a desync{waiting}."
            cause = ("Ranks at the same sequence number called different collectives (or different sizes): the "
                     "program took different paths on different ranks.")
            fix = ("Find the branch that depends on the rank or on data (an early exit, a conditional all_reduce, "
                   "a different number of parameters with gradients) and make every rank call the same "
                   "collectives in the same order.")
        elif stall_kind == "rank_gone":
            summary = f"{stuck[0].upper() + stuck[1:]} is gone (dead or unreachable) while the others wait in {what}{waiting}."
            cause = "The named rank's process ended or stopped answering; its collectives will never come."
            fix = ("Read that rank's own log for why it ended (exception, OOM kill, signal); restart the job, or "
                   "use an elastic launcher that restarts lost ranks.")
        else:
            summary = f"{stuck[0].upper() + stuck[1:]} never entered {what}{waiting}."
            cause = ("The other ranks are waiting for the named rank, which is somewhere else: its stack below (from "
                     "gpuguard's watchdog) says where.")
            fix = ("Fix what holds that rank at the place its stack shows (a slow data loader, I/O, a lock, a "
                   "rank-dependent branch that skips the collective).")
        stack = first.get("stack")
        devices = (f"stack of {stuck}: {stack.strip()[:1000]}",) if stack else ()
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), devices, cause, fix, group.sorted_evidence(),
                         group.occurrences)
