"""NCCL RAS (`ncclras`, NCCL 2.24+): ranks missing or dead, and ranks behind in collective counts (text and JSON)."""

from __future__ import annotations

import re
from typing import Any

from ..model import Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser, context_field

# The NCCL User Guide, Troubleshooting > RAS (docs/troubleshooting/ras.rst), sample output of `ncclras`:
#   #0-0 (cf264af53edbe986) INCOMPLETE
#     Missing communicator data from 1 rank
#     The missing rank: 21
#   DEAD
#     1 job process is considered dead (unreachable via the RAS network)
#     Process 3487984 on node 172.16.64.213 managing GPU 5
#   #0-0 (27a079b828ff1a75) MISMATCH
#     Communicator ranks have different collective operation counts
#     26 ranks have launched up to operation 6650
#     6 ranks have launched up to operation 6649
#     Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210
# Monitor mode (-m, 2.29+): "[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing GPU 1".
# JSON (-f json, 2.28.7+): "missing_ranks": [{"rank": 1, "host": ..., "pid": ..., "cuda_dev": 1, "status":
# {"unresponsive": true, "considered_dead": false}}], and in monitor mode "event": "PEER_DEAD".
_MISSING_RANKS = re.compile(r"The missing ranks?: (?P<ranks>\d{1,9}(?:, ?\d{1,9}){0,4095})")
_MISSING_FROM = re.compile(r"Missing communicator data from (?P<n>\d{1,9}) (?P<what>rank|job process)")
_DEAD = re.compile(r"(?P<n>\d{1,9}) job process(?:es)? (?:is|are) considered dead")
_PROCESS = re.compile(r"Process (?P<pid>\d{1,10}) on node (?P<node>[\w.:-]{1,255}) managing GPUs? (?P<gpu>[\d, ]{1,64})")
_PEER_DEAD = re.compile(r"PEER_DEAD: Process (?P<pid>\d{1,10}) on node (?P<node>[\w.:-]{1,255})")
_LAUNCHED = re.compile(r"(?P<n>\d{1,9}) ranks? ha(?:ve|s) launched up to operation (?P<op>\d{1,19})")
_BEHIND_RANK = re.compile(
    r"Rank (?P<rank>\d{1,9}) -- GPU (?P<gpu>\d{1,4}) managed by process (?P<pid>\d{1,10}) on node (?P<node>[\w.:-]{1,255})")
_JSON_MISSING = re.compile(r'"missing_ranks_count"\s{0,8}:\s{0,8}(?P<n>\d{1,9})')
_JSON_STATUS = re.compile(r'"(?P<what>unresponsive|considered_dead)"\s{0,8}:\s{0,8}true')
_JSON_EVENT = re.compile(r'"event"\s{0,8}:\s{0,8}"PEER_DEAD"')
_JSON_FIELD = re.compile(r'"(?P<key>rank|host|pid|cuda_dev)"\s{0,8}:\s{0,8}"?(?P<value>[\w.:-]{1,255})"?')

MISSING = "nccl_ras_missing"
BEHIND = "nccl_ras_behind"


def _json_record(context: Any, limit: int = 16) -> dict[str, str]:
    """The fields of the JSON object a status line belongs to: the nearest "rank"/"host"/"pid" lines above it."""
    found: dict[str, str] = {}
    for _, text in list(context)[-limit:][::-1]:
        m = _JSON_FIELD.search(text)
        if m and m.group("key") not in found:
            field = context_field(text, re.compile(re.escape(m.group(0)[:m.start("value") - m.start()]) +
                                                   r'(?P<value>[\w.:-]{1,255})'), "value")
            if field.value is not None:
                found[m.group("key")] = field.value
        if "rank" in found and "host" in found and "pid" in found:
            break
    return found


def _rank_list(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in re.split(r", ?", text) if r)


def _add_process(group: Group, line: Line, m: "re.Match[str]") -> None:
    """The process a RAS line names (pid, node and, where said, GPU), each read whole or not at all."""
    pid, node = line.value(m, "pid"), line.value(m, "node")
    gpu = line.value(m, "gpu") if "gpu" in m.groupdict() else ""
    if pid is None or node is None or gpu is None:
        group.unreadable("a process RAS named")
        return
    _note_process(group, pid, node, gpu)


def _note_process(group: Group, pid: str, node: str, gpu: str = "") -> None:
    processes: dict[str, None] = group.facts.setdefault("processes", {})
    if len(processes) < 64:
        processes.setdefault(f"process {pid} on {node}" + (f" (GPU {gpu.strip()})" if gpu.strip() else ""), None)


class NcclRas(Recogniser):
    """What NCCL's RAS reports about a job that stopped progressing: who is missing or dead, who is behind."""

    kinds = (MISSING, BEHIND)
    keywords = ("The missing rank", "Missing communicator data from", "considered dead", "PEER_DEAD: Process",
                "have launched up to operation", "has launched up to operation", "managed by process", "managing GPU",
                '"missing_ranks_count"', '"unresponsive": true', '"considered_dead": true', '"PEER_DEAD"')
    patterns = (_MISSING_RANKS, _MISSING_FROM, _DEAD, _PEER_DEAD, _PROCESS, _LAUNCHED, _BEHIND_RANK, _JSON_MISSING,
                _JSON_STATUS, _JSON_EVENT)
    help = "NCCL RAS reports (ncclras: missing, dead and lagging ranks, text and JSON)"
    examples = (
        # `ncclras` text output, as the NCCL User Guide (Troubleshooting > RAS) shows it
        Example("#0-0 (cf264af53edbe986) INCOMPLETE\n"
                "  Missing communicator data from 1 rank\n"
                "  The missing rank: 21\n"
                "DEAD\n"
                "  1 job process is considered dead (unreachable via the RAS network)\n"
                "  Process 3487984 on node 172.16.64.213 managing GPU 5\n",
                MISSING, (21,), ("rank 21", "1 process(es) considered dead", "process 3487984 on 172.16.64.213 (GPU 5)")),
        Example("#0-0 (27a079b828ff1a75) MISMATCH\n"
                "  Communicator ranks have different collective operation counts\n"
                "  26 ranks have launched up to operation 6650\n"
                "  6 ranks have launched up to operation 6649\n"
                "  Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210\n",
                BEHIND, (0,), ("26 rank(s) at operation 6650, 6 rank(s) at operation 6649",
                               "process 483072 on 172.16.64.210 (GPU 0)")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body = line.body
        m = _MISSING_RANKS.search(body)
        if m:
            group = groups(MISSING)
            ranks = line.value(m, "ranks", _rank_list)
            if ranks is None:
                group.unreadable("the missing ranks")
            group.add(line.number, body.strip(), ranks=ranks or ())
            return True
        m = _MISSING_FROM.search(body) or _DEAD.search(body)
        if m:
            group = groups(MISSING)
            group.add(line.number, body.strip())
            if "dead" in m.group(0):
                n = line.integer(m, "n")
                if n is None:
                    group.unreadable("how many processes are dead")
                else:
                    group.facts["dead"] = group.facts.get("dead", 0) + n
            return True
        m = _PEER_DEAD.search(body)
        if m:
            group = groups(MISSING)
            group.add(line.number, body.strip())
            group.facts["dead"] = group.facts.get("dead", 0) + 1
            _add_process(group, line, m)
            return True
        m = _PROCESS.search(body)
        if m:  # a process RAS lists under INCOMPLETE or DEAD
            group = groups(MISSING)
            group.add(line.number, body.strip())
            _add_process(group, line, m)
            return True
        m = _LAUNCHED.search(body)
        if m:
            group = groups(BEHIND)
            group.add(line.number, body.strip())
            n, op = line.integer(m, "n"), line.integer(m, "op")
            if n is None or op is None:
                group.unreadable("a count of collectives")
                return True
            counts: dict[int, int] = group.facts.setdefault("counts", {})
            if len(counts) < 64:
                counts[op] = counts.get(op, 0) + n
            return True
        m = _BEHIND_RANK.search(body)
        if m:
            # the outliers RAS lists under a MISMATCH: the ranks of the smaller count group
            group = groups(BEHIND)
            rank = line.integer(m, "rank")
            if rank is None:
                group.unreadable("a rank behind")
            group.add(line.number, body.strip(), ranks=(rank,))
            _add_process(group, line, m)
            return True
        m = _JSON_MISSING.search(body)
        if m:
            n = line.integer(m, "n")
            if n is None or n > 0:
                groups(MISSING).add(line.number, body.strip())
                if n is None:
                    groups(MISSING).unreadable("how many ranks are missing")
            return True
        m = _JSON_STATUS.search(body) or _JSON_EVENT.search(body)
        if m:
            group = groups(MISSING)
            record = _json_record(line.context)
            rank = int(record["rank"]) if record.get("rank", "").isdigit() else None
            group.add(line.number, body.strip(), ranks=(rank,))
            if "considered_dead" in m.group(0) or "PEER_DEAD" in m.group(0):
                group.facts["dead"] = group.facts.get("dead", 0) + 1
            if record.get("pid") and record.get("host"):
                _note_process(group, record["pid"], record["host"], record.get("cuda_dev", ""))
            return True
        return False

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        processes = tuple(group.facts.get("processes", {}))
        ranks = tuple(sorted(group.ranks))
        if kind == MISSING:
            dead = group.facts.get("dead", 0)
            who = ranks_phrase(ranks) if ranks else "some ranks"
            summary = (f"NCCL's RAS is missing {who} of a communicator" +
                       (f"; {dead} process(es) considered dead (unreachable for 60 s)" if dead else "") + ".")
            cause = ("RAS threads in every NCCL process watch each other over TCP. A rank is 'missing' when its "
                     "process did not answer the RAS query (stopped, hung with its RAS thread starved, or exited) "
                     "and 'dead' once it stayed unreachable for 60 seconds. The collectives of that communicator "
                     "cannot complete without it: every other rank will hang in its next collective.")
            fix = ("Look at the named process first: is it alive (ps -p PID on that node), and where is it (py-spy "
                   "dump --native --pid PID)? Its own log shows why it stopped (an exception, an OOM kill, a "
                   "signal). Repeat the ncclras query: a rank missing only once, during start-up or shutdown, is "
                   "normal.")
        else:
            counts: dict[int, int] = group.facts.get("counts", {})
            spread = ", ".join(f"{n} rank(s) at operation {op}" for op, n in sorted(counts.items(), reverse=True))
            summary = ("Ranks of one NCCL communicator have launched different numbers of collectives" +
                       (f" ({spread})" if spread else "") +
                       (f"; behind: {ranks_phrase(ranks)}" if ranks else "") + ".")
            cause = ("RAS counts the collectives each rank has launched. Ranks briefly apart are normal while a job "
                     "runs; the same gap in repeated queries means the ranks behind never called the next "
                     "collective: they are stuck elsewhere (data loading, a checkpoint, an exception swallowed, a "
                     "different code path), so the others wait in it.")
            fix = ("Query again (ncclras) a minute later: if the counts did not move, dump the stacks of the ranks "
                   "behind (py-spy dump --pid on the named processes) to see where they are instead of the "
                   "collective.")
        return Diagnosis(kind, summary, ranks, processes, cause, fix, group.sorted_evidence(), group.occurrences)
