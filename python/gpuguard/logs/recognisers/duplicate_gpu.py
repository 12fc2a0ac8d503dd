"""NCCL's "Duplicate GPU detected" (<= 2.29) and "Multiple Ranks are using the same GPU" (>= 2.30)."""

from __future__ import annotations

import re
from typing import Optional

from ..model import MAX_DEVICES, MAX_RANKS, Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser

# NCCL <= 2.29, src/init.cc (initTransportsRank):
#   WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", rank, i, busId)
# (older releases printed the bus id with %x).
_DUPLICATE = re.compile(
    r"Duplicate GPU detected : rank (?P<a>\d{1,9}) and rank (?P<b>\d{1,9}) both on CUDA device (?P<dev>[0-9A-Fa-f]{1,16})")
# NCCL >= 2.30, src/init.cc (initTransportsRank):
#   WARN("Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this "
#        "configuration.")
_MULTI_RANK = re.compile(r"Multiple Ranks are using the same GPU/Partition")
# The bus id of a device whose number a paste broke across lines where the break cannot be told.
UNREADABLE_BUS = "a GPU whose PCI bus id is unreadable"


def nccl_device_to_pci_bus_id(number: str) -> Optional[str]:
    """The PCI bus id behind the device number in NCCL's "Duplicate GPU detected" message.

    NCCL's busIdToInt64 (src/misc/utils.cc) drops ':' and '.' from the bus id string and reads the rest as
    hex; the message prints that integer with %lx. int64ToBusId, in the same file, inverts it with
    "%04lx:%02lx:%02lx.%01lx" of (id >> 20, (id & 0xff000) >> 12, (id & 0xff0) >> 4, id & 0xf), which is
    what this does: "10000" -> "0000:10:00.0", "50" -> "0000:00:05.0". None when it is not such a number.
    """
    text = number.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 16 or any(c not in "0123456789abcdef" for c in text):
        return None
    value = int(text, 16)
    return f"{value >> 20:04x}:{(value & 0xFF000) >> 12:02x}:{(value & 0xFF0) >> 4:02x}.{value & 0xF:01x}"


class _UnionFind:
    """The sets of ranks NCCL's pairs put on one GPU."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class DuplicateGpu(Recogniser):
    """Two or more ranks of one NCCL communicator on one GPU, as NCCL reports it."""

    kinds = ("duplicate_gpu",)
    keywords = ("Duplicate GPU detected", "Multiple Ranks are using the same GPU")
    patterns = (_DUPLICATE, _MULTI_RANK)
    help = "NCCL duplicate-GPU errors"
    examples = (
        # NCCL <= 2.29's WARN as torch raises it (NCCLUtils: "Last error:" then NCCL's text); 1000 = 0000:01:00.0
        Example("[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                "[rank1]: Last error:\n"
                "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n",
                "duplicate_gpu", (0, 1), ("0000:01:00.0",)),
        # the same WARN under NCCL's own line prefix (src/debug.cc), a bus id with letters
        Example("node7:2811:2811 [3] init.cc:1027 NCCL WARN Duplicate GPU detected : rank 7 and rank 5 both on CUDA "
                "device 1a000\n", "duplicate_gpu", (5, 7), ("0000:1a:00.0",)),
        # NCCL >= 2.30 (src/init.cc), under torchrun's per-rank prefix
        Example("[rank2]:node7:4242:4242 [0] init.cc:1141 (initTransportsRank) NCCL WARN Multiple Ranks are using the "
                "same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.\n",
                "duplicate_gpu", (2,), ("cuda:0",)),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body, origin = line.body, line.origin
        m = _DUPLICATE.search(body)
        if m:
            group = groups("duplicate_gpu")
            # (host, pci bus id) -> ranks, as NCCL's pairs join them; the number NCCL printed for it
            dup_ranks: dict[tuple[str, str], _UnionFind] = group.facts.setdefault("dup_ranks", {})
            dup_numbers: dict[tuple[str, str], Optional[str]] = group.facts.setdefault("dup_numbers", {})
            a, b, number = line.integer(m, "a"), line.integer(m, "b"), line.value(m, "dev")
            if a is None or b is None:
                group.unreadable("a rank NCCL named")
            if number is None:
                group.unreadable("the CUDA device (PCI bus id) NCCL named")
                bus = UNREADABLE_BUS
            else:
                bus = nccl_device_to_pci_bus_id(number) or f"NCCL device {number}"
            key = (origin.host or "", bus)
            if key not in dup_ranks and len(dup_ranks) >= MAX_DEVICES:
                return True
            uf = dup_ranks.setdefault(key, _UnionFind())
            if len(uf.parent) < MAX_RANKS:
                if a is not None and b is not None:
                    uf.union(a, b)
                for r in (a, b):
                    if r is not None:
                        uf.find(r)
            dup_numbers[key] = number
            group.add(line.number, body, ranks=(a, b, origin.rank))
            if origin.ray:
                group.facts["ray"] = True
            return True
        if _MULTI_RANK.search(body):
            group = groups("duplicate_gpu")
            group.facts["multi_rank_message"] = True
            if origin.ray:
                group.facts["ray"] = True
            devices = [f"cuda:{origin.nccl_device} in the process of {origin.describe() or 'a rank'}"] \
                if origin.nccl_device is not None else []
            group.add(line.number, body, ranks=(origin.rank,), devices=devices)
            return True
        return False

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        devices: list[str] = []
        sharing: list[str] = []
        all_sets: list[list[int]] = []
        dup_numbers: dict[tuple[str, str], str] = group.facts.get("dup_numbers", {})
        folded = _hostless_folded(group.facts.get("dup_ranks", {}))
        for (on, bus), uf in folded.items():
            sets: dict[int, list[int]] = {}
            for r in uf.parent:
                sets.setdefault(uf.find(r), []).append(r)
            where = _where(host, on, bus)
            number = dup_numbers[(on, bus)]
            if bus == UNREADABLE_BUS:
                label = "unreadable: NCCL's device number is broken across lines in this text"
            else:
                label = f"{bus} (NCCL's 'CUDA device {number}')" if not bus.startswith("NCCL") else bus
            devices.append(label + (f" {where}" if where else ""))
            for ranks in sets.values():
                all_sets.append(sorted(ranks))
                sharing.append(f"{ranks_phrase(ranks)} {'share' if len(ranks) > 1 else 'shares'} {bus}" +
                               (f" on host {on}" if on else ""))
        multi = group.facts.get("multi_rank_message", False)
        for d in group.devices:
            devices.append(d)
        if sharing:
            summary = "Two or more ranks of one NCCL communicator are on the same GPU: " + "; ".join(sharing) + "."
        else:
            who = f" (reported by {ranks_phrase(group.ranks)})" if group.ranks else ""
            summary = ("Two or more ranks of one NCCL communicator are on the same GPU or MIG partition" + who +
                       ". NCCL 2.30 and later do not say which ranks or which GPU.")
        cause = _cause(all_sets, group.facts.get("ray", False))
        one_gpu_here = _one_gpu_here(host, {on for on, _ in folded})
        fix = one_gpu_here or ("Give every rank its own GPU: call torch.cuda.set_device(local_rank) (LOCAL_RANK from the launcher) "
               "before init_process_group, or use gpuguard.init_process_group(), which binds each rank to its GPU "
               "and stops every rank with one report naming all ranks per device before NCCL starts. Start no more "
               "processes per node than it has GPUs; in Ray give each rank of a communicator a GPU of its own (num_gpus=1, "
               "or a placement-group bundle {'GPU': 1} per rank, which verl's RayResourcePool already gives: there "
               "max_colocate_count lets only other worker groups share a GPU, and ranks of one worker group on one "
               "GPU mean two Ray nodes on one host, or CUDA initialised before Ray set CUDA_VISIBLE_DEVICES).")
        if multi and not one_gpu_here:
            fix += (" Set NCCL_MULTI_RANK_GPU_ENABLE=1 only if sharing is intended (several ranks on purpose on one "
                    "GPU or one MIG instance); it does not fix a placement mistake.")
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), tuple(devices), cause, fix,
                         group.sorted_evidence(), group.occurrences)


def _hostless_folded(dup_ranks: dict[tuple[str, str], _UnionFind]) -> dict[tuple[str, str], _UnionFind]:
    """The pairs read without a host joined to those of the same bus id read with one, where they share a rank.
    torch's error repeats NCCL's text after "Last error:" without NCCL's host:pid prefix, so with NCCL_DEBUG=WARN
    a log holds each pair in both forms; a rank is on one host, so they are the same GPU, to be named once. The
    order stays the log's."""
    folded: dict[tuple[str, str], _UnionFind] = {}
    for key, uf in dup_ranks.items():  # copies, in the log's order: the facts stay as read
        folded[key] = _UnionFind()
        if key[0]:
            folded[key].parent = dict(uf.parent)
    for (on, bus), uf in dup_ranks.items():
        if on:
            continue
        sets: dict[int, list[int]] = {}
        for r in uf.parent:
            sets.setdefault(uf.find(r), []).append(r)
        for ranks in sets.values():
            into = next((f for (f_on, f_bus), f in folded.items()
                         if f_on and f_bus == bus and any(r in f.parent for r in ranks)), folded[(on, bus)])
            for r in ranks:
                into.union(ranks[0], r)
    # a pair without a host goes only where all its ranks went elsewhere (one whose ranks were unreadable stays)
    return {key: uf for key, uf in folded.items() if key[0] or uf.parent or not dup_ranks[key].parent}


def _cause(sets: list[list[int]], ray: bool = False) -> str:
    base = ("NCCL found two ranks on one host whose GPUs have the same PCI bus id, so they share one GPU. ")
    if ray:
        # the lines come from Ray workers: Ray packs actors onto one GPU when each asks for a fraction of it
        base += ("The ranks are Ray workers: Ray puts several actors on one GPU when each asks for a fraction "
                 "(num_gpus < 1, e.g. 0.5) outside a placement-group bundle of its own, and NCCL refuses two ranks of one "
                 "communicator on one GPU. ")
    if sets and len(sets) == 1 and len(sets[0]) > 2:
        return base + ("Every rank named is on the same GPU: most often torch.cuda.set_device was not called "
                       "(every rank stays on cuda:0), or every rank was given the same CUDA_VISIBLE_DEVICES.")
    pairs = sum(len(s) - 1 for s in sets)
    strides = {b - a for s in sets for a, b in zip(s, s[1:])}
    if pairs >= 2 and len(strides) == 1 and next(iter(strides)) > 1:
        g = next(iter(strides))
        return base + (f"The ranks sharing a GPU differ by {g}: the pattern of device = rank % {g}, i.e. more "
                       f"processes per node than its {g} GPU(s) (nproc_per_node larger than the GPU count).")
    if pairs == 1:
        base += "One pair shows no pattern, so the log alone cannot tell which mistake placed them. "
    if ray:
        return base + "Otherwise: the same CUDA_VISIBLE_DEVICES for every actor, or a device chosen by hand."
    return base + ("Common causes: a missing torch.cuda.set_device(local_rank); more processes per node than "
                   "GPUs; Ray actors given fractional GPUs (num_gpus < 1) without a bundle of their own; the same "
                   "CUDA_VISIBLE_DEVICES for every rank.")


def _one_gpu_here(host: Host, hosts: set[str]) -> str:
    """The fix when the log was written on this host and it shows one GPU: there is no second GPU to move to.
    ``hosts``: the hosts the pairs were read on ('' for a pair without one)."""
    if not host.match_local:
        return ""
    local = host.log_is_local or (hosts and hosts <= {host.name()})
    devices = host.devices() if local else None
    if not devices or len(devices) != 1:
        return ""
    return ("This host shows 1 GPU, so two ranks on it cannot each have their own: torch.cuda.set_device(local_rank) "
            "would make local rank 1 ask for cuda:1, which does not exist here. Start one GPU process per GPU "
            "(torchrun --nproc_per_node=1 on this host, one num_gpus=1 actor per GPU in Ray) and add GPUs or hosts for "
            "more ranks; with NCCL 2.30 or later, NCCL_MULTI_RANK_GPU_ENABLE=1 lets ranks share the GPU on purpose "
            "(slower, and only if that is what you want).")


def _where(host: Host, on: str, bus: str) -> str:
    """Where a bus id is on this machine, if the log was written here; '' when that cannot be told."""
    if not host.match_local or bus.startswith("NCCL") or bus == UNREADABLE_BUS:
        return ""
    if on and on != host.name():
        return f"on host {on} (not this host, {host.name()}: not matched to a local GPU)"
    local = host.devices()
    if not local:
        return ""
    match = next((d for d in local if str(getattr(d, "pci_bus_id", "")).lower() == bus), None)
    if match is None:
        if on:
            return "(no GPU visible on this host has this bus id)"
        return "(no GPU visible here has this bus id: the log is from another host, or it is hidden here)"
    if on:  # NCCL's prefix names this very host
        return f"= GPU {match.index} on this host ({match.uuid})"
    return f"= GPU {match.index} here ({match.uuid}), if the job ran on this host"
