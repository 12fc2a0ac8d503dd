"""PyTorch's flight recorder: its dumps, and torchfrtrace's "Not all ranks joining collective" (who never entered)."""

from __future__ import annotations

import re

from ..model import MAX_RANKS, Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser, context_field

# torchfrtrace (torch/distributed/flight_recorder/components/builder.py, match_one_event), as the PyTorch tutorial
# "Flight Recorder for Debugging Stuck Jobs" shows it:
#   Not all ranks joining collective 5 at entry 4
#   group info: 0:default_pg
#   collective: nccl:all_reduce
#   missing ranks: {1}
# newer releases: "Not all ranks joining collective, sequence number: 4".
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (dumpDebuggingInfo):
#   logPrefix() + "ProcessGroupNCCL dumping nccl trace to " + writer.getWriterTarget()
_NOT_ALL = re.compile(r"Not all ranks joining collective(?:,? sequence number:? | )(?P<seq>\d{1,19})")
_MISSING = re.compile(r"missing ranks: \{(?P<ranks>[\d, ]{0,16384})\}")
_COLLECTIVE = re.compile(r"collective: (?P<op>[\w:]{1,128})")
_GROUP = re.compile(r"group info: (?P<group>\S{1,256})")
_DUMP = re.compile(r"(?:Rank (?P<rank>\d{1,9})\] )?ProcessGroup\w{0,16} dumping nccl trace to (?P<path>\S{1,4096})")

KIND = "flight_recorder_missing_ranks"
DUMPED = "flight_recorder_dumped"


def _rank_list(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in re.split(r"[, ]+", text) if r)


class FlightRecorder(Recogniser):
    """Ranks that never joined a collective (torchfrtrace), and where the flight recorder wrote its traces."""

    kinds = (KIND, DUMPED)
    keywords = ("Not all ranks joining collective", "missing ranks: {", "dumping nccl trace to ")
    patterns = (_NOT_ALL, _MISSING, _DUMP)
    help = "PyTorch flight recorder dumps and torchfrtrace 'Not all ranks joining collective'"
    examples = (
        # torchfrtrace's report, as the PyTorch tutorial "Flight Recorder for Debugging Stuck Jobs" shows it
        Example("Not all ranks joining collective 5 at entry 4\ngroup info: 0:default_pg\ncollective: nccl:all_reduce\n"
                "missing ranks: {1}\n", KIND, (1,), ("nccl:all_reduce #5 of group 0:default_pg",)),
        # ProcessGroupNCCL's dump on a timeout
        Example("[rank0]:[E1121 05:10:00.123456 ProcessGroupNCCL.cpp:1234] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
                "ProcessGroupNCCL dumping nccl trace to /tmp/nccl_trace_rank_0\n", DUMPED, (0,),
                ("/tmp/nccl_trace_rank_0",)),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body = line.body
        m = _NOT_ALL.search(body)
        if m:
            group = groups(KIND)
            group.add(line.number, body.strip())
            seq = line.integer(m, "seq")
            if seq is None:
                group.unreadable("the collective's sequence number")
            else:
                group.facts["seq"] = seq
            return True
        m = _MISSING.search(body)
        if m:
            group = groups(KIND)
            ranks = line.value(m, "ranks", _rank_list)
            if ranks is None:
                group.unreadable("the missing ranks")
            group.add(line.number, body.strip(), ranks=(ranks or ())[:MAX_RANKS])
            for _, text in list(line.context)[-8:]:  # the entry's own lines above: its collective and group
                for pattern, key, what in ((_COLLECTIVE, "op", "the collective"), (_GROUP, "group", "the group")):
                    field = context_field(text, pattern, key)
                    if field.found and field.value is None:
                        group.facts.pop(key, None)
                        group.unreadable(what)
                    elif field.found:
                        group.facts[key] = field.value
            return True
        m = _DUMP.search(body)
        if m:
            group = groups(DUMPED)
            said = line.integer(m, "rank")
            if said is None and m.group("rank"):
                group.unreadable("the rank")
            rank = line.origin.rank if line.origin.rank is not None else said
            group.add(line.number, body.strip(), ranks=(rank,))
            paths: dict[str, None] = group.facts.setdefault("paths", {})
            path = line.value(m, "path")
            if path is None:
                group.unreadable("where the trace was written")
            elif len(paths) < 16:
                paths.setdefault(path, None)
            return True
        return False

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        ranks = tuple(sorted(group.ranks))
        if kind == DUMPED:
            paths = tuple(group.facts.get("paths", {}))
            summary = f"PyTorch's flight recorder dumped its trace of the last collectives{group.who()}."
            cause = ("A collective timed out (or a dump was requested), so each rank wrote the collectives it "
                     "recorded. A rank with no dump line here never wrote one: it may be the one that hung or died.")
            fix = ("Collect every rank's file in one folder and run torchfrtrace on it (torchfrtrace --prefix "
                   "<file prefix> <folder>): it names the collective that not all ranks joined and the ranks "
                   "missing from it.")
            return Diagnosis(kind, summary, ranks, paths, cause, fix, group.sorted_evidence(), group.occurrences)
        op, seq, pg = group.facts.get("op"), group.facts.get("seq"), group.facts.get("group")
        what = (op or "a collective") + (f" #{seq}" if seq is not None else "") + (f" of group {pg}" if pg else "")
        who = ranks_phrase(ranks) if ranks else "some ranks"
        summary = f"{who[0].upper() + who[1:]} never joined {what}; the other ranks waited in it."
        cause = ("The flight recorder holds each rank's collectives in order. The ranks named did not reach this "
                 "one: they are stuck or busy elsewhere (a data loader, a checkpoint, an exception they caught, a "
                 "different code path or a different order of collectives), or they died. The ranks that did "
                 "join are the victims, not the cause.")
        fix = ("Look at what the missing ranks were doing: their own log (an exception before the collective?), their "
               "stacks (py-spy dump --pid while hung), and the code path that decides whether a rank calls this "
               "collective (every rank must call the same collectives in the same order).")
        return Diagnosis(kind, summary, ranks, (), cause, fix, group.sorted_evidence(), group.occurrences)
