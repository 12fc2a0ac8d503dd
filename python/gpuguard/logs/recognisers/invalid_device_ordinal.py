"""CUDA's "invalid device ordinal": a process asked for a GPU number beyond the GPUs it can see."""

from __future__ import annotations

import itertools
import re

from ..lines import strip_prefixes
from ..model import MAX_RANKS, Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

# CUDA's error string for cudaErrorInvalidDevice / CUDA_ERROR_INVALID_DEVICE, as torch prints it through
# c10/cuda/CUDAException.h: "CUDA error: invalid device ordinal", followed since torch 2.6 by
# c10/cuda/CUDAMiscFunctions.cpp's hint "GPU device may be out of range, do you have enough GPUs?".
# (The pattern starts with its literal, so a search jumps from one occurrence to the next: linear in the line.)
_INVALID_ORDINAL = re.compile(r"invalid device ordinal")
# A preceding line of the same process that shows how the device was chosen (kept as evidence): the nearest
# CONTEXT_LOOKBACK lines, the head of each (a traceback's source line is short).
_CONTEXT_WORDS = ("set_device(", ".to(", ".cuda(", "cuda:", "LOCAL_RANK", "local_rank")
_CONTEXT_PATTERNS = re.compile(r"device\s{0,8}=|\brank\b")
CONTEXT_LOOKBACK = 16
CONTEXT_HEAD = 512


def _shows_device_choice(text: str) -> bool:
    head = text[:CONTEXT_HEAD]
    if "invalid device ordinal" in head:
        return False
    return any(w in head for w in _CONTEXT_WORDS) or (
        ("device" in head or "rank" in head) and _CONTEXT_PATTERNS.search(head) is not None)


class InvalidDeviceOrdinal(Recogniser):
    """A device index beyond the visible GPUs: most often the global rank used where the local rank belongs."""

    kinds = ("invalid_device_ordinal",)
    keywords = ("invalid device ordinal",)
    patterns = (_INVALID_ORDINAL,)
    help = "CUDA 'invalid device ordinal'"
    # PyTorch's device-mismatch text may quote an invalid ordinal; that line is the mismatch's.
    yields_to = ("device_mismatch",)
    examples = (
        # torch's CUDA error (c10/cuda/CUDAException.h) under its per-rank excepthook prefix, with the traceback
        # line that chose the device
        Example("[rank9]: Traceback (most recent call last):\n"
                "[rank9]:   File \"/work/train.py\", line 8, in main\n"
                "[rank9]:     torch.cuda.set_device(rank)\n"
                "[rank9]: torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                "[rank9]: GPU device may be out of range, do you have enough GPUs?\n",
                "invalid_device_ordinal", (9,), ("on rank 9",)),
        # the issue's own: a RuntimeError quoted bare
        Example("RuntimeError: CUDA error: invalid device ordinal\n", "invalid_device_ordinal", (), ()),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body, origin = line.body, line.origin
        if not _INVALID_ORDINAL.search(body):
            return False
        group = groups("invalid_device_ordinal")
        group.add(line.number, body, ranks=(origin.rank,))
        group.source(origin)
        if origin.local_rank is not None and len(group.facts.setdefault("local_ranks", set())) < MAX_RANKS:
            group.facts["local_ranks"].add(origin.local_rank)
        for ctx_line, ctx_text in itertools.islice(reversed(line.context), CONTEXT_LOOKBACK):
            if _shows_device_choice(ctx_text):
                ctx_body, ctx_origin = strip_prefixes(ctx_text)
                if ctx_origin.key() == origin.key():
                    group.evidence_line(ctx_line, ctx_body.strip())
                    break
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        ranks = sorted(group.ranks)
        local = sorted(group.facts.get("local_ranks", ()))
        who = group.who()
        summary = (f"CUDA rejected a device index{who}: the process asked for a GPU number that is not among the "
                   "GPUs it can see.")
        cause = ("A device index counts only the GPUs visible to the process (CUDA_VISIBLE_DEVICES narrows and "
                 "renumbers them from 0). The usual mistake is passing the GLOBAL rank where the LOCAL rank "
                 "belongs: torch.cuda.set_device(rank) works on the first node and fails on the second, where "
                 "ranks start at the GPU count. Also: more processes per node than GPUs, or a process (a Ray "
                 "actor, a job with CUDA_VISIBLE_DEVICES set per rank) that sees one GPU but asks for cuda:N.")
        if ranks and ranks[0] > 0 and not local:
            cause += (f" The lowest failing rank is {ranks[0]}; if ranks below it are on the first node, that node "
                      f"has {ranks[0]} GPU(s) and the failing ranks used their global rank as a device index.")
        fix = ("Select the device with the LOCAL rank: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) "
               "(SLURM_LOCALID under srun, OMPI_COMM_WORLD_LOCAL_RANK under mpirun), or cuda:0 in a process that "
               "sees one GPU. gpuguard.bind() resolves the local rank from whichever launcher started the process "
               "and refuses an impossible mapping, saying how many GPUs the host shows.")
        return Diagnosis(kind, summary, tuple(ranks), (), cause, fix, group.sorted_evidence(), group.occurrences)
