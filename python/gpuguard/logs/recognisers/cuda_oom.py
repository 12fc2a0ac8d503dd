"""torch's CUDA out-of-memory message (torch >= 2.1): the GPU, its capacity and free memory, every process on it
with its memory, and which pattern it shows: stray contexts of other ranks, another job, or a genuine shortage.

The text comes from c10/cuda/CUDACachingAllocator.cpp. Since torch 2.1 it lists, for the GPU that ran out, each
process NVML reports with its memory ("Process 1374765 has 414.00 MiB memory in use.") and marks this one
("Including non-PyTorch memory, this process has 37.46 GiB memory in use."), in NVML's order. The wordings read:

- 2.1: "GPU 0 has a total capacty of ..." (sic) and "... try setting max_split_size_mb to avoid fragmentation.";
- 2.2 on: "total capacity", and "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
- later: "PYTORCH_ALLOC_CONF=expandable_segments:True", "torch.OutOfMemoryError" for "torch.cuda.OutOfMemoryError",
  and optional pieces between the list and "Of the allocated memory" (a per-process memory fraction's
  "... allowed;", "... allocated in private pools (e.g., CUDA Graphs),").

A message a terminal or viewer wrapped is put back together from the lines before the one that completes it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Optional

from ..lines import Origin, strip_prefixes
from ..model import Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

_SIZE = r"\d{1,12}(?:\.\d{1,4})? (?:bytes|KiB|MiB|GiB|TiB|PiB)"
_START = re.compile(rf"CUDA out of memory\. Tried to allocate (?P<request>{_SIZE})\. GPU (?P<gpu>\d{{1,5}}) has a "
                    rf"total capac(?:ity|ty) of (?P<total>{_SIZE}) of which (?P<free>{_SIZE}) is free\.")
_PROCESS = re.compile(rf"(?:Process (?P<pid>\d{{1,10}})|Including non-PyTorch memory, (?P<this>this process)) has "
                      rf"(?P<memory>{_SIZE}) memory in use")
_ALLOCATED = re.compile(rf"Of the allocated memory (?P<allocated>{_SIZE}) is allocated by PyTorch(?:, and "
                        rf"(?P<unallocated>{_SIZE}) is reserved by PyTorch but unallocated)?")
_START_WORDS = "CUDA out of memory. Tried to allocate"
_NO_ORIGIN = (None, None, None, None)
#: Pieces of one wrapped message looked back over.
MAX_PIECES = 24
#: Messages kept per kind (each rank of a job may print one).
MAX_MESSAGES = 16
#: A process holding at most this is about one CUDA context (300-500 MiB with CUDA >= 11.7, more before: see
#: gpuguard.system.processes.TYPICAL_CONTEXT_COST) with a few small tensors.
CONTEXT_SIZED = 1536 << 20

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


def parse_size(text: str) -> int:
    number, unit = text.split(" ")
    return int(float(number) * _UNITS[unit])


def size_text(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / 1024:.2f} KiB" if n >= 1024 else f"{n} bytes"


@dataclass(frozen=True)
class OomProcess:
    pid: Optional[int]  # None: "this process" (torch does not print its pid)
    memory: int

    @property
    def this(self) -> bool:
        return self.pid is None


@dataclass(frozen=True)
class OomMessage:
    gpu: int
    request: int
    total: int
    free: int
    processes: tuple[OomProcess, ...]
    allocated: Optional[int]
    unallocated: Optional[int]

    @property
    def self_by_host_pid(self) -> Optional[OomProcess]:
        """The listed process that is most likely this one under another pid. torch marks "this process" by
        comparing NVML's pids with its own; in a container NVML may answer with the host's pids (NVIDIA/
        nvidia-docker#1483), and then no entry is marked. The entry that holds at least what PyTorch says this
        process allocated and reserved, and at most 2 GiB more (its context and libraries), is this process."""
        if any(p.this for p in self.processes) or self.allocated is None:
            return None
        own = self.allocated + (self.unallocated or 0)
        fits = [p for p in self.processes if own <= p.memory <= own + (2 << 30)]
        return min(fits, key=lambda p: p.memory) if fits else None

    @property
    def others(self) -> tuple[OomProcess, ...]:
        me = self.self_by_host_pid
        return tuple(p for p in self.processes if not p.this and p != me)

    @property
    def this_process(self) -> Optional[OomProcess]:
        return next((p for p in self.processes if p.this), None) or self.self_by_host_pid

    def kind(self) -> str:
        others = self.others
        if not others or self.request > self.total:
            return "oom_genuine"
        if any(p.memory > CONTEXT_SIZED for p in others):
            return "oom_other_process"
        return "oom_stray_contexts"


def parse_message(text: str) -> Optional[OomMessage]:
    """The facts of one whole message (from "CUDA out of memory" to "Of the allocated memory"), or None."""
    start = _START.search(text)
    if start is None:
        return None
    tail = text[start.end():]
    end = tail.find("Of the allocated memory")
    if end < 0:
        return None
    listing = tail[:end]
    processes = tuple(OomProcess(int(m["pid"]) if m["pid"] else None, parse_size(m["memory"]))
                      for m in itertools.islice(_PROCESS.finditer(listing), 256))
    allocated = _ALLOCATED.search(tail, end)
    return OomMessage(gpu=int(start["gpu"]), request=parse_size(start["request"]), total=parse_size(start["total"]),
                      free=parse_size(start["free"]), processes=processes,
                      allocated=parse_size(allocated["allocated"]) if allocated else None,
                      unallocated=parse_size(allocated["unallocated"]) if allocated and allocated["unallocated"]
                      else None)


def _assemble(line: Line) -> Optional[tuple[int, list[str], Origin]]:
    """(line number of its first piece, the whole message read each way its breaks may join) for the message
    ``line`` completes: the line alone, or the line with the pieces of the same process before it that a terminal,
    a viewer or the program broke off. A long message breaks at many places and the text may not say how each
    joins; the readings are the two a single wrapper makes (a terminal keeps every character; a viewer or a person
    breaks at spaces, which the pieces lost), each piece's own indentation left out."""
    number, origin = line.number, line.origin
    at = line.body.find(_START_WORDS)
    if at >= 0:
        return number, [line.body[at:]], origin
    pieces = [_text(line.printed) if line.printed is not None else line.body]
    for ctx_number, ctx_raw in itertools.islice(reversed(line.context), MAX_PIECES):
        if ctx_number >= number:  # the explainer joined that piece to this line already
            continue
        if ctx_number != number - 1:
            return None  # a gap: not one message
        _, above = strip_prefixes(ctx_raw)
        if origin.key() != _NO_ORIGIN and above.key() != origin.key():
            return None  # another process's line (a piece without a prefix may go on a prefixed line)
        origin = above
        pieces.insert(0, _text(ctx_raw))
        number = ctx_number
        if _START_WORDS in "".join(pieces) or _START_WORDS in " ".join(p.strip() for p in pieces):
            break
    else:
        return None
    readings = []
    for text in ("".join(pieces), " ".join(p.strip() for p in pieces)):
        at = text.find(_START_WORDS)
        if at >= 0 and text[at:] not in readings:
            readings.append(text[at:])
    return (number, readings, origin) if readings else None


def _text(printed: str) -> str:
    """A piece of a broken message: without its prefixes when it has some (the program printed it again), as it
    is otherwise (a terminal may have broken the line just before a blank)."""
    body, origin = strip_prefixes(printed)
    return body if origin.key() != _NO_ORIGIN or body != printed.lstrip() else printed.rstrip("\r\n")


class CudaOutOfMemory(Recogniser):
    """torch's CUDA out-of-memory error, read for who holds the GPU's memory."""

    kinds = ("oom_stray_contexts", "oom_other_process", "oom_genuine")
    # any piece of a wrapped message at or after "Of the allocated memory" holds one of the last three
    keywords = ("CUDA out of memory", "memory in use", "allocated by PyTorch", "reserved by PyTorch",
                "Memory Management")
    patterns = (_START, _PROCESS, _ALLOCATED)
    help = "torch's CUDA out-of-memory error (who holds the GPU's memory)"
    examples = (
        # awslabs/keys_values#92 (torch 2.9 era wording), rank 0 of a 4-rank job: three other ranks hold 414 MiB each
        Example("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 572.00 MiB. GPU 0 has a total "
                "capacity of 39.49 GiB of which 321.31 MiB is free. Process 3721648 has 414.00 MiB memory in use. "
                "Including non-PyTorch memory, this process has 37.46 GiB memory in use. Process 1374765 has 414.00 "
                "MiB memory in use. Process 1374763 has 414.00 MiB memory in use. Process 1374764 has 414.00 MiB "
                "memory in use. Of the allocated memory 36.04 GiB is allocated by PyTorch, and 321.37 MiB is reserved "
                "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
                "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n",
                "oom_stray_contexts", (0,), ("pid 1374764 414.00 MiB", "this process 37.46 GiB")),
        # rwth-i6/returnn#1649 (torch 2.2+ wording): the crashed previous run still holds 71.62 GiB
        Example("OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a total capacity of "
                "93.00 GiB of which 134.94 MiB is free. Process 118636 has 71.62 GiB memory in use. Including "
                "non-PyTorch memory, this process has 21.24 GiB memory in use. Of the allocated memory 19.85 GiB is "
                "allocated by PyTorch, and 731.17 MiB is reserved by PyTorch but unallocated. If reserved but "
                "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                "fragmentation.\n", "oom_other_process", (), ("pid 118636 71.62 GiB",)),
        # qingze-bai/VSmTrans#3 (torch 2.2+ wording): nobody but this process
        Example("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a total capacity "
                "of 15.70 GiB of which 210.38 MiB is free. Including non-PyTorch memory, this process has 15.48 GiB "
                "memory in use. Of the allocated memory 14.81 GiB is allocated by PyTorch, and 336.73 MiB is reserved "
                "by PyTorch but unallocated.\n", "oom_genuine", (), ("this process 15.48 GiB",)),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        assembled = _assemble(line)
        if assembled is None:
            return False
        first, readings, origin = assembled
        if all("Of the allocated memory" not in text for text in readings):
            # the message goes on past this line: a later piece (with a keyword) reads it whole
            return any(_START.search(text) is not None for text in readings)
        parsed = [(text, m) for text in readings for m in [parse_message(text)] if m is not None]
        if not parsed:
            return False
        # the reading that lists the most (a join that glued two words loses a process), then the first
        text, message = max(parsed, key=lambda tm: (len(tm[1].processes), tm[1].allocated is not None))
        listing = text[:text.find("Of the allocated memory")]
        if "".join(listing.split()).count("memoryinuse") > len(message.processes):
            # a process the text lists that no reading of its breaks reads whole: who holds the memory, and so the
            # kind of shortage, cannot be told (never a "no other process" the text does not say)
            return True
        if any(m != message for _, m in parsed):
            # the breaks join two ways that read different numbers: the diagnosis without them
            groups(message.kind()).unreadable("the sizes and processes torch listed (the message is broken "
                                              "across lines where the text does not tell how the pieces join)")
        group = groups(message.kind())
        messages: dict[tuple, tuple[Optional[int], OomMessage]] = group.facts.setdefault("messages", {})
        key = (origin.key(), first)
        if key in messages:  # a later piece of the same message: the longer text says more
            messages[key] = (origin.rank, message)
            return True
        if any(k[0] == key[0] and m == message for k, (_, m) in messages.items()):
            group.occurrences += 1  # the same message printed again (a chained exception, a logger echoing it)
            return True
        if len(messages) < MAX_MESSAGES:
            messages[key] = (origin.rank, message)
        group.add(first, text, ranks=(origin.rank,), devices=(f"cuda:{message.gpu}",))
        group.source(origin)
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        messages = list(group.facts.get("messages", {}).values())
        rank, message = messages[0]
        who = group.who()
        lines = [_summary(message)]
        if len(messages) > 1:
            lines.append(f"{len(messages)} such messages{who}; the first is shown.")
        seen_here = _local_facts(message, host) if host.log_is_local else ""
        if kind == "oom_stray_contexts":
            cause, fix = _stray(message)
        elif kind == "oom_other_process":
            cause, fix = _other(message)
        else:
            cause, fix = _genuine(message)
        summary = f"CUDA ran out of memory{who} on GPU {message.gpu}. " + " ".join(lines) + seen_here
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), tuple(group.devices), cause, fix,
                         group.sorted_evidence(), group.occurrences)


def _summary(m: OomMessage) -> str:
    me = m.self_by_host_pid
    listed = "; ".join(("this process" if p.this else f"pid {p.pid}"
                        + (" (this process, under its host pid)" if p == me else "")) + f" {size_text(p.memory)}"
                       for p in m.processes)
    return (f"It has {size_text(m.total)}, {size_text(m.free)} was free, {size_text(m.request)} was asked for. "
            + (f"Processes using it: {listed}." if listed else "torch listed no process on it (NVML unavailable "
                                                               "to torch, or none but this one)."))


def _without_others(m: OomMessage) -> str:
    held = sum(p.memory for p in m.others)
    would_be = m.free + held
    enough = "enough" if would_be >= m.request else "still not enough"
    return (f"Together they hold {size_text(held)}; without them {size_text(would_be)} would be free, {enough} for "
            f"the {size_text(m.request)} asked for.")


def _stray(m: OomMessage) -> tuple[str, str]:
    others = m.others
    sizes = ", ".join(f"pid {p.pid}: {size_text(p.memory)}" for p in others[:8])
    cause = (f"{len(others)} other process{'es' if len(others) != 1 else ''} on this GPU hold about a CUDA "
             f"context's worth each ({sizes}{', ...' if len(others) > 8 else ''}): the signature of stray "
             "contexts. The job's other ranks (or other processes of it) used this GPU before calling "
             "torch.cuda.set_device, typically through torch.load without map_location, a torch.cuda call at "
             "import time, or torch.cuda.synchronize() before set_device, and each context (300-500 MiB with CUDA "
             ">= 11.7) stays until its process exits. " + _without_others(m))
    fix = ("On every rank, call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first, before any other CUDA "
           "call, and load checkpoints with torch.load(path, map_location='cpu') (or "
           "map_location=f'cuda:{local_rank}'). gpuguard.bind() (or running the job under `gpuguard run`) stops a "
           "rank that already made such a context, naming the rank and both GPUs.")
    return cause, fix


def _other(m: OomMessage) -> tuple[str, str]:
    big = sorted((p for p in m.others if p.memory > CONTEXT_SIZED), key=lambda p: -p.memory)
    named = "; ".join(f"pid {p.pid} holds {size_text(p.memory)} ({100 * p.memory / max(m.total, 1):.0f}% of the GPU)"
                      for p in big[:8])
    cause = (f"{named}: a process this one did not start holds a large share of the GPU: a run that did not exit, "
             "another user's job, or a server sharing the GPU. " + _without_others(m))
    pids = " ".join(str(p.pid) for p in big[:8])
    fix = (f"Find it on the host that printed this: ps -o pid,user,lstart,args -p {pids} (from inside a container, "
           "nvidia-smi on the host: the driver may name the host's pids). Stop it if it is a leftover of yours, or "
           "run on a GPU nobody else uses (CUDA_VISIBLE_DEVICES). gpuguard.bind(require_exclusive=True) refuses "
           "a GPU that other processes hold memory on.")
    return cause, fix


def _genuine(m: OomMessage) -> tuple[str, str]:
    this = m.this_process
    if m.request > m.total:
        cause = (f"The allocation alone ({size_text(m.request)}) is larger than the whole GPU "
                 f"({size_text(m.total)}): no placement is to blame.")
    else:
        mine = f" this process holds {size_text(this.memory)}" if this else ""
        if m.self_by_host_pid is not None:
            mine += (f" (torch did not mark it: pid {m.self_by_host_pid.pid} holds what PyTorch allocated here, so it is "
                     "this process under the host's pid, as NVML names processes seen from a container)")
        others = (f"; the other processes hold only {size_text(sum(p.memory for p in m.others))}"
                  if m.others else ", and no other process holds memory on it")
        cause = f"The memory went to this process itself:{mine}{others}. No placement cause is to blame."
    if m.allocated is not None:
        cause += f" PyTorch had allocated {size_text(m.allocated)}"
        cause += (f" and reserved {size_text(m.unallocated)} more that it had not handed out" if m.unallocated
                  else "") + "."
    fix = ("Use less memory per GPU: a smaller batch (or sequence length, or gradient accumulation), activation "
           "checkpointing, lower precision, or sharding across GPUs (FSDP, ZeRO). If the reserved-but-unallocated "
           "memory is large, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torch >= 2.1; newer torch also "
           "reads PYTORCH_ALLOC_CONF) to reduce fragmentation.")
    return cause, fix


def _local_facts(m: OomMessage, host: Host) -> str:
    """What this host shows now of the pids the message names (the log was written here)."""
    from ...system.processes import describe_pid

    seen = []
    for p in m.others[:8]:
        view = describe_pid(p.pid)
        if view.visible:
            seen.append(f"pid {p.pid} is running here now: {view.describe()}")
    if not seen:
        return " None of the pids it names runs on this host now."
    return " " + "; ".join(seen) + " (a pid may have been reused since the log was written)."
