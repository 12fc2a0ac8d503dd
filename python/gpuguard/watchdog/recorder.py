"""Where watch() learns a collective's progress: torch's flight recorder when this torch has one for the job's
backends, else gpuguard's wrappers (the fallback); and where a recorded collective was issued (its call site).

The flight recorder counts every collective of every process group, whatever issued it (DDP's C++ reducer, FSDP,
functional collectives, Python calls), and its per-group status says which completed -- for NCCL from the CUDA
events ProcessGroupNCCL's own watchdog polls. The watchdog's thread reads that status without the GIL through
``gpuguard._libtorch.flight_recorder_reader()``. Stack traces need the GIL to symbolise, so call sites are read
here, by a helper thread, when a report needs one. A process's first symbolisation is slow: torch's symbolizer
imports 908 modules (torch._inductor among them, on torch 2.15), 1.1 s on an idle core and 2.6 s on a loaded one,
all of it holding the GIL. watch() pays it itself, in the thread that starts the watch (warm_symbolisation), before
the job trains: paid by the helper thread at the first collective, it stopped the training thread for seconds.
"""

from __future__ import annotations

import os
import pickle
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .._core import read_flight_recorder

#: GPUGUARD_WATCH_SOURCE=wrappers forces the fallback (what a torch without the recorder gets)
SOURCE_VARIABLE = "GPUGUARD_WATCH_SOURCE"


@dataclass
class ProgressSource:
    """What the watchdog reads: the recorder (reader capsule and sources) or, when ``reader`` is None, the
    wrappers, with why."""
    reader: Any = None
    sources: list[str] = field(default_factory=list)
    note: str = ""          # the recorder's, for the report
    calls_note: str = ""    # the wrappers' and w.collective()'s, for the report
    fallback_reason: str = ""


def _recorder_sources(backend: str) -> list[str]:
    """The flight recorders of a group's backend string ('gloo', 'nccl', 'cpu:gloo,cuda:nccl', a plugin's name)."""
    out: list[str] = []
    for part in backend.split(","):
        name = part.split(":")[-1].strip().lower()
        if name and name not in out:
            out.append(name)
    return out


#: torch keeps flight recorder entries unasked from 2.11: FlightRecorder's own default went from 0 to 2000 entries
#: in pytorch#172843 (January 2026); the 2.6 and 2.10 headers read 0, the 2.15 headers 2000
RECORDS_UNASKED_FROM = (2, 11)
#: what gpuguard asks for when it may (torch's own later default); TORCH_NCCL_TRACE_BUFFER_SIZE is read by every
#: supported torch, TORCH_FR_BUFFER_SIZE only by newer ones (2.10's headers read it, 2.6's do not)
BUFFER_VARIABLE, BUFFER_ENTRIES = "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _buffer_setting(environ: Any) -> Optional[tuple[str, str]]:
    for var in ("TORCH_FR_BUFFER_SIZE", BUFFER_VARIABLE):
        value = environ.get(var)
        if value:
            return var, value
    return None


def ask_torch_to_record(environ: Any = os.environ) -> bool:
    """Before the first process group exists: asks a torch that keeps no recorder entries by default to keep
    them (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, read when torch creates its recorder), unless the user set either
    variable. True when it set it."""
    if _torch_version() >= RECORDS_UNASKED_FROM or _buffer_setting(environ) is not None:
        return False
    environ[BUFFER_VARIABLE] = BUFFER_ENTRIES
    return True


def _buffer_off(environ: Any) -> Optional[str]:
    setting = _buffer_setting(environ)
    if setting is not None:
        var, value = setting
        return f"{var}={value} turns torch's flight recorder off" if value.strip() == "0" else None
    if _torch_version() < RECORDS_UNASKED_FROM:
        return (f"torch {torch.__version__.split('+')[0]} keeps no flight recorder entries unless "
                f"{BUFFER_VARIABLE} is set (from torch 2.11 it keeps 2000), and the process group existed before "
                f"gpuguard.watch() could set it: set {BUFFER_VARIABLE}={BUFFER_ENTRIES} in the job's environment, or "
                f"start the watch before init_process_group (bind(watch=True) does)")
    return None


MARKED_NOTE = ("progress from w.collective(): complete when its block ended, or when the CUDA event recorded on "
               "the stream after a w.collective(stream=...) block did")
CALLS_NOTE = ("progress from gpuguard's wrappers of torch.distributed's collective functions and w.collective(): "
              "complete when the call returned, when an async_op work completed, or when the CUDA event after a "
              "w.collective(stream=...) did")


def choose_source(environ: Any = os.environ) -> ProgressSource:
    """The recorder when it can be read for every backend of the default group, else the wrappers and why."""
    version = torch.__version__.split("+")[0]
    def fallback(reason: str) -> ProgressSource:
        return ProgressSource(calls_note=f"{CALLS_NOTE}; torch's flight recorder is not used: {reason}",
                              fallback_reason=reason)
    forced = environ.get(SOURCE_VARIABLE, "")
    if forced not in ("", "recorder", "wrappers"):
        raise ValueError(f"{SOURCE_VARIABLE}={forced!r}: use 'recorder' (the default where torch has one) or "
                         f"'wrappers' (gpuguard's wrappers of the Python collective functions)")
    if forced == "wrappers":
        return fallback(f"{SOURCE_VARIABLE}=wrappers")
    try:
        from .._libtorch_loader import libtorch
        reader = libtorch().flight_recorder_reader()
    except (ImportError, AttributeError) as exc:
        return fallback(f"gpuguard cannot read it here ({exc})")
    sources = _recorder_sources(str(dist.get_backend()))
    for source in sources:
        try:
            read_flight_recorder(reader, source)
        except RuntimeError as exc:
            return fallback(f"backend '{source}': {exc}")
    off = _buffer_off(environ)  # after the backends: one without a recorder is the first reason
    if off:
        return fallback(off)
    if "gloo" not in sources:  # a CPU side group (new_group(backend="gloo")) beside an NCCL default group
        try:
            read_flight_recorder(reader, "gloo")
            sources.append("gloo")
        except RuntimeError:
            pass
    note = (f"progress from torch {version}'s flight recorder ({', '.join(sources)}): a collective is complete "
            f"when torch says it completed")
    return ProgressSource(reader=reader, sources=sources, note=note, calls_note=MARKED_NOTE)


def describe_groups(dog: Any) -> None:
    """Tells the watchdog what users call each process group and its global ranks (the recorder knows names)."""
    world = distributed_c10d._world
    for pg, name in list(getattr(world, "pg_names", {}).items()):
        try:
            desc = getattr(pg, "group_desc", "") or ""
            if not desc or desc == "undefined":
                desc = name
            dog.describe_group(name, desc, list(dist.get_process_group_ranks(pg)))
        except Exception:  # a group this rank is not part of, or one being destroyed
            continue


# ---- call sites ------------------------------------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _framework(frames: list[dict], op: str) -> str:
    """Who issued a collective whose Python frames (innermost first) are these, when torch's own code did."""
    files = [(f.get("filename", ""), f.get("name", "")) for f in frames]
    def under(part: str) -> bool:
        return any(part in path.replace(os.sep, "/") for path, _ in files)
    if under("torch/distributed/fsdp") or under("torch/distributed/_composable/fsdp"):
        return "FSDP"
    if under("torch/nn/parallel/distributed.py"):
        names = {name for path, name in files if path.endswith("distributed.py")}
        if "__init__" in names:
            return "DDP's construction (it checks and broadcasts the parameters from rank 0)"
        return "DDP's forward (its buffer broadcast)"
    if any(name == "_engine_run_backward" for _, name in files) or under("torch/autograd/"):
        if op == "ALL_REDUCE":
            return "the backward pass: DDP's gradient all-reduce, from its C++ reducer"
        return "the backward pass: a gradient hook's collective, e.g. FSDP's reduce-scatter or a DDP comm hook"
    if under("torch/distributed/_functional_collectives"):
        return "a functional collective"
    return ""


def describe_site(entry: dict) -> str:
    """'train.py:42 (the backward pass: DDP's gradient all-reduce ...)' for one flight recorder entry."""
    frames = entry.get("frames") or []
    op = str(entry.get("profiling_name", "")).split(":")[-1].upper()
    framework = _framework(frames, op)
    user = next((f for f in frames if not str(f.get("filename", "")).startswith(_TORCH_DIR)), None)
    if user is None:
        thread = str(entry.get("thread_name", ""))
        if framework:
            return framework
        if thread.startswith("pt_autograd"):
            return (f"the autograd engine's thread {thread} (no Python caller): the backward pass, e.g. DDP's "
                    f"gradient all-reduce from its C++ reducer")
        return f"no Python caller (issued from C++ on thread {thread or '?'})"
    site = f"{user.get('filename')}:{user.get('line')}"
    return f"{site} ({framework})" if framework else site


def _entries(source: str) -> list[dict]:
    c10d = torch._C._distributed_c10d
    if source == "nccl":
        raw = c10d._dump_nccl_trace(True, True, False)
    else:
        raw = c10d._dump_fr_trace(True, True, False, source)
    return list(pickle.loads(raw).get("entries", []))


_symbolised = False  # this process paid its first symbolisation (once per process, whatever the watch)


def warm_symbolisation() -> None:
    """Pays this process's slow first symbolisation (the modules torch's symbolizer imports) here, on one short
    Python stack of this thread, without dumping the recorder; afterwards a dump's symbolisation takes milliseconds."""
    global _symbolised
    if _symbolised:
        return
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    symbolize_tracebacks([gather_traceback(python=True, script=False, cpp=False)])
    _symbolised = True


def site_of(source: str, group: str, seq: int) -> str:
    for entry in _entries(source):
        pg = entry.get("process_group") or ("", "")
        if str(pg[0]) == group and int(entry.get("collective_seq_id", -1)) == seq:
            return describe_site(entry)
    return ""


class SiteAnswerer:
    """A daemon thread answering the watchdog's requests for call sites; it waits in C++ without the GIL and
    ends when the watchdog stops. join() after the watchdog's stop(): a daemon thread still inside the C++ wait
    when the interpreter finalises is ended by CPython as it takes the GIL back, which C++ cannot unwind."""

    def __init__(self, dog: Any) -> None:
        self._dog = dog
        self.answered = 0  # requests answered: one per report that needed a call site
        self._thread = threading.Thread(target=self._run, name="gpuguard-watch-sites", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            request = self._dog.next_site_request()
            if request is None:
                return
            try:
                describe_groups(self._dog)
                site = site_of(request.source, request.group, request.seq)
            except Exception as exc:  # the report goes out without a call site, saying why
                site = f"(call site unknown: {type(exc).__name__}: {exc})"
            self._dog.answer_site(request.id, site)
            self.answered += 1

    def join(self, timeout: float = 10.0) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
