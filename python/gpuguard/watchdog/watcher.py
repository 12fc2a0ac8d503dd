"""gpuguard.watch(): start the collective watchdog of this rank; the Watch handle that stops it.

The work happens in C++ (``_core.Watchdog``, csrc/gpuguard/watchdog.*): a thread that needs no GIL, with a store
client of its own, that reads each collective's progress from torch's flight recorder (``recorder.py``) or, where
this torch has none for the job's backend, from gpuguard's wrappers of the collective functions
(``collectives.py``). This module finds the job's store and starts the C++ side at once when the default process
group exists, else right after ``init_process_group`` (or at the first collective after it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .._core import Watchdog
from .collectives import Wrapped, describe_sizes, group_identity
from .recorder import SOURCE_VARIABLE, ProgressSource, SiteAnswerer, ask_torch_to_record, choose_source, \
    describe_groups, warm_symbolisation
from . import stacks
from . import node_tier as tiers

logger = logging.getLogger("gpuguard")

ON_STALL = ("report", "raise")
#: on_stall="raise" ends the process with this code once the report is out (EX_TEMPFAIL: worth a restart).
STALL_EXIT_CODE = 75
#: the floor of the adaptive threshold, in seconds
MIN_STALL_S = 60.0

_active: Optional["Watch"] = None
_generation = 0

#: The healthy watchdogs of a job together make at most this many store operations per second (one per rank per
#: tick): at most a fifth of what one TCPStore server's thread answers (benchmarks/bench_scale.py measured 5.4 to
#: 9.7 us of its CPU per request: 100,000 to 185,000 a second), leaving the rest to torch and to reports.
JOB_CHECKS_PER_S = 20000.0
#: The tick of a job small enough that JOB_CHECKS_PER_S does not bind (up to 20,000 ranks).
DEFAULT_TICK_S = 1.0
#: Past this many ranks watch() uses the per-node tier by default (node_tier.py): one check per rank per second
#: would pass JOB_CHECKS_PER_S.
NODE_TIER_ABOVE_RANKS = int(JOB_CHECKS_PER_S * DEFAULT_TICK_S)


def default_tick(checkers: int) -> float:
    """Seconds between checks when watch() is not given a tick: 1 s, or longer where the job's ranks that ask the
    store (every rank; with the per-node tier, one per node) are so many that one check each per second would load
    its one store past JOB_CHECKS_PER_S (5 s for 100,000 ranks without the tier; 1 s for them on 8-GPU nodes with
    it, whose 12,500 leaders stay under the limit)."""
    return max(DEFAULT_TICK_S, checkers / JOB_CHECKS_PER_S)


def _check_arguments(stall_after: Optional[float], on_stall: str, tick: Optional[float], gather: float) -> None:
    if stall_after is not None and (isinstance(stall_after, bool) or not isinstance(stall_after, (int, float))
                                    or not stall_after > 0):
        raise ValueError(f"stall_after={stall_after!r}: give the seconds a collective may wait, a positive number, "
                         f"or None for the adaptive threshold (at least {MIN_STALL_S:g} s)")
    if on_stall not in ON_STALL:
        raise ValueError(f"on_stall={on_stall!r}: use 'report' (print the report, keep running) or 'raise' (print "
                         f"it, then end the process with exit code {STALL_EXIT_CODE} so the scheduler restarts it)")
    for name, value in (("tick", tick), ("gather", gather)):
        if name == "tick" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name}={value!r}: give seconds, a positive number")


def _store_address(store: Any) -> tuple[str, int]:
    """host and port of the TCPStore under ``store`` (default: the default process group's store)."""
    if isinstance(store, tuple) and len(store) == 2:
        return str(store[0]), int(store[1])
    found = store if store is not None else distributed_c10d._get_default_store()
    seen = found
    while isinstance(seen, dist.PrefixStore):
        seen = seen.underlying_store
    if isinstance(seen, dist.TCPStore):
        return seen.host, seen.port
    raise ValueError(f"gpuguard.watch() needs the job's TCPStore (torchrun's, or env:// init's), but the store is "
                     f"a {type(seen).__name__}: its watchdog thread talks to the store without Python, which only "
                     f"a TCPStore allows. Pass store=(host, port) of a TCPStore every rank can reach.")


def _watch_contexts(rank: int) -> bool:
    """Reports a CUDA context this rank makes on another GPU from now on (context_monitor), unless the zero-code
    mode already does; the rank's GPU is the current device, once torch has initialised CUDA."""
    from ..system import context_monitor

    if context_monitor.current() is not None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    context_monitor.start(rank, torch.cuda.current_device())
    return True


def _gpu_uuid() -> str:
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return "GPU-" + str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except Exception:  # pragma: no cover - a torch without CUDA support
        pass
    return ""


class Watch:
    """One rank's running watchdog (see watch()). stop() ends it and restores torch.distributed."""

    def __init__(self, *, stall_after: Optional[float], on_stall: str, store: Any, report_dir: Optional[str],
                 tick: Optional[float], gather: float, node_tier: Optional[bool] = None,
                 launch_context: Optional[Callable[[], Any]] = None) -> None:
        global _generation
        _generation += 1
        self.stall_after = stall_after
        self.on_stall = on_stall
        self._store = store
        self._report_dir = report_dir
        self._tick = tick
        self._gather = gather
        self._node_tier = node_tier
        self._launch_context = launch_context
        self._generation = _generation
        self._dog: Optional[Watchdog] = None
        self._failed = False
        self._groups: dict[Any, int] = {}
        self._wrapped = Wrapped(self._enter, self._leave, on_init=self._watchdog)
        self._sites: Optional[SiteAnswerer] = None
        self.source: Optional[ProgressSource] = None
        self.report_path: Optional[str] = None
        self.tick_s: Optional[float] = None  # the tick in use, once the watchdog started
        self.node_tier: Optional[tiers.NodeTier] = None  # this rank's place in the per-node tier, if used
        if not (dist.is_available() and dist.is_initialized()):
            ask_torch_to_record()  # torch before 2.11: its recorder keeps no entries unless asked before it exists
        else:
            try:
                self._start()
            except BaseException:
                self._wrapped.restore()
                raise

    # ---- the C++ side ------------------------------------------------------------------------------------

    def _start(self) -> Watchdog:
        host, port = _store_address(self._store)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        run = os.environ.get("TORCHELASTIC_RUN_ID", "job") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefix = f"gpuguard/watch/{run}/{self._generation}/"
        tier = (tiers.place(host, port, prefix, self._launch_context)
                if tiers.wanted(self._node_tier, world_size, NODE_TIER_ABOVE_RANKS) else None)
        if tier is not None and tier.leader:
            tiers.remove_abandoned(tier)
        checkers = world_size if tier is None else -(-world_size // tier.local_world_size)
        self.tick_s = self._tick if self._tick is not None else default_tick(checkers)
        directory = self._report_dir or os.environ.get("GPUGUARD_WATCH_DIR") or tempfile.gettempdir()
        self.report_path = os.path.join(directory, f"gpuguard-stall-rank{rank}-pid{os.getpid()}.json")
        source = choose_source()
        if source.reader is not None:  # the first symbolisation, here rather than in the helper thread later
            try:
                warm_symbolisation()
            except Exception as exc:  # reports then pay it, or go without their call sites; the job goes on
                logger.warning("gpuguard.watch: could not prepare torch's symbolizer for call sites: %s", exc)
        no_stacks = stacks.arm()  # Python 3.10 and 3.13: the stacks through faulthandler's signal handler
        if no_stacks:
            logger.warning("gpuguard.watch: stall reports will carry no Python stack: %s", no_stacks)
        if source.reader is None and rank == 0 and not source.fallback_reason.startswith(SOURCE_VARIABLE):
            logger.warning(
                "gpuguard.watch: torch's flight recorder is not used (%s), so progress comes from gpuguard's wrappers "
                "of torch.distributed's Python collective functions: a stall in a collective issued from C++ (DDP's "
                "gradient all-reduce, FSDP's all-gathers and reduce-scatters) is not reported", source.fallback_reason)
        dog = Watchdog(
            store_host=host, store_port=port, prefix=prefix, rank=rank,
            world_size=world_size, host=socket.gethostname(), pid=os.getpid(), gpu=_gpu_uuid(),
            stall_after_s=float(self.stall_after or 0), min_stall_s=MIN_STALL_S, tick_s=float(self.tick_s),
            gather_s=float(self._gather), report_path=self.report_path, exit_on_stall=self.on_stall == "raise",
            exit_code=STALL_EXIT_CODE, flight_recorder=source.reader, recorder_sources=source.sources,
            source_note=source.note, calls_note=source.calls_note,
            node_relay_path=tier.path if tier is not None else "", node_leader=tier is not None and tier.leader)
        self.node_tier = tier
        describe_groups(dog)
        self.source = source
        if source.reader is not None:
            self._wrapped.restore()  # the recorder sees every collective: nothing to wrap, nothing to pay per call
            self._sites = SiteAnswerer(dog)
        self._dog = dog
        self._watches_contexts = _watch_contexts(rank)
        logger.info("gpuguard.watch: rank %d watches its collectives (store %s:%d, stall after %s; %s)", rank, host,
                    port, f"{self.stall_after:g} s" if self.stall_after else f"adaptive, at least {MIN_STALL_S:g} s",
                    source.note or source.calls_note)
        return dog

    def _watchdog(self) -> Optional[Watchdog]:
        if self._dog is None and not self._failed:
            try:
                self._start()
            except (ValueError, RuntimeError) as exc:  # never break the job's collective for the watchdog
                self._failed = True
                print(f"gpuguard.watch: rank {dist.get_rank()}: not watching: {exc}", file=sys.stderr)
        return self._dog

    def _enter(self, op: str, group: Any, first: Any, site: str,
               sizes: Optional[str] = None) -> Optional[tuple[Watchdog, int, int]]:
        dog = self._dog or self._watchdog()
        if dog is None:
            return None
        try:
            index = self._groups.get(group)
            if index is None:
                _, gname, desc, ranks = group_identity(group)
                index = self._groups[group] = dog.add_group(gname, desc, ranks)
            seq = dog.enter(index, op, describe_sizes(first) if sizes is None else sizes, site)
        except Exception:  # a group torch itself refuses (this rank not in it): torch's call says so, not ours
            return None
        return dog, index, seq

    @staticmethod
    def _leave(token: Optional[tuple[Watchdog, int, int]], result: Any = None) -> None:
        if token is None:
            return
        dog, index, seq = token
        future = getattr(result, "get_future", None)  # async_op=True: a Work, complete when its future is
        if future is not None:
            try:
                future().add_done_callback(lambda _: dog.complete(index, seq))
                return
            except RuntimeError:  # a backend whose Work has no future: complete when the call returned
                pass
        dog.complete(index, seq)

    # ---- the public handle -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def collective(self, op: str, group: Any = None, sizes: str = "", stream: Any = None) -> Iterator[None]:
        """Marks a collective torch does not see (NCCL called directly, e.g. a PyNccl communicator) so that the
        watchdog tracks it: ``with w.collective("all_reduce", stream=torch.cuda.current_stream()): comm.all_reduce(t)``.
        With ``stream`` (a torch.cuda.Stream or a raw CUDA stream handle) the collective completes when the work
        queued there so far completes, as NCCL's does: a CUDA event recorded on it at the end of the block, polled
        by the watchdog's thread. Without, it completes when the block ends."""
        caller = sys._getframe(2)
        token = self._enter(op.upper(), group, None, f"{caller.f_code.co_filename}:{caller.f_lineno}", sizes)
        try:
            yield
        except BaseException:
            self._leave(token)
            raise
        if token is not None and stream is not None:
            handle = getattr(stream, "cuda_stream", stream)
            dog, index, seq = token
            try:
                dog.exit_on_stream(index, seq, int(handle))
                return
            except (RuntimeError, TypeError, ValueError) as exc:  # never break the job's collective for the watchdog
                print(f"gpuguard.watch: cannot follow {op} on stream {handle!r} ({exc}); it counts as complete "
                      f"when its block ended", file=sys.stderr)
        self._leave(token)

    @property
    def stall_threshold_s(self) -> Optional[float]:
        return self._dog.stall_threshold_s if self._dog is not None else None

    @property
    def store_ops(self) -> int:
        return self._dog.store_ops if self._dog is not None else 0

    @property
    def ticks(self) -> int:
        """Checks the watchdog's thread has completed (its first comes one tick after the start)."""
        return self._dog.ticks if self._dog is not None else 0

    @property
    def reports(self) -> int:
        return self._dog.reports if self._dog is not None else 0

    @property
    def relayed_ticks(self) -> int:
        """Healthy ticks this rank took from its node leader's answer instead of asking the store."""
        return self._dog.relayed_ticks if self._dog is not None else 0

    @property
    def unrelayed_ticks(self) -> int:
        """Ticks of a follower of the tier that asked the store: its leader's answer was missing or too old."""
        return self._dog.unrelayed_ticks if self._dog is not None else 0

    def last_report(self) -> Optional[str]:
        """The last stall report as JSON text, or None."""
        return (self._dog.last_report_json or None) if self._dog is not None else None

    def stop(self) -> None:
        global _active
        self._wrapped.restore()
        if getattr(self, "_watches_contexts", False):
            from ..system import context_monitor

            context_monitor.stop()
        if self._dog is not None:
            self._dog.stop()  # also ends the site answerer's wait
        if self._sites is not None:
            self._sites.join()
            self._sites = None
        if _active is self:
            _active = None

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def watch(stall_after: Optional[float] = None, *, on_stall: str = "report",
          store: Union[None, Any, tuple[str, int]] = None, report_dir: Optional[str] = None,
          tick: Optional[float] = None, gather: float = 5.0, node_tier: Optional[bool] = None,
          launch_context: Optional[Callable[[], Any]] = None) -> Watch:
    """Watches this rank's collectives; call it on every rank. Returns the running Watch (stop() ends it).

    When a collective has waited longer than ``stall_after`` seconds (None: adaptive, four times the longest
    wait or gap seen so far and at least 60 s), the ranks compare notes through the job's store and every rank
    prints one report naming the stuck rank, its host, the collective, where it was issued and where each rank's
    CPU waits now (its Python stack), and writes it as JSON ({"gpuguard_stall": {...}}) to ``report_dir``
    (default $GPUGUARD_WATCH_DIR or the temp folder). Progress comes from torch's flight recorder where this torch
    keeps one for the job's backend (every collective, DDP's and FSDP's included, complete when torch says so),
    else from wrappers of torch.distributed's collective functions; the report says which.
    on_stall="raise" ends the process (exit code 75) after the report; "report" never stops the job.
    store: the job's TCPStore, or (host, port); default: the default process group's.
    node_tier: True: each node's first rank (local rank 0) asks the store for the whole node and the node's other
    ranks read its answer from shared memory (they ask the store themselves when it is missing or three ticks
    old), so the job's steady store traffic grows with nodes, not ranks; False: every rank asks; None:
    $GPUGUARD_WATCH_NODE_TIER (1 or 0), else True past 20,000 ranks. A report is the same either way.
    tick: seconds between the watchdog's checks (one store operation each); None: 1 s, or the number of ranks that
    ask the store / 20,000 s where that is more, so that the job's checks stay within what one TCPStore answers
    (100,000 ranks: 5 s without the tier, 1 s with it on 8-GPU nodes). gather: how long the rank that composes
    the report waits for ranks that do not answer (then named dead or unreachable).
    Call it before or after init_process_group(); the watchdog starts with the first collective then.
    """
    global _active
    _check_arguments(stall_after, on_stall, tick, gather)
    if _active is not None:
        raise RuntimeError("gpuguard.watch() is already running in this process; stop() it first")
    if node_tier is not None and not isinstance(node_tier, bool):
        raise ValueError(f"node_tier={node_tier!r}: give True, False or None (decided by the job's size)")
    tiers.wanted(node_tier, 1, NODE_TIER_ABOVE_RANKS)  # a bad GPUGUARD_WATCH_NODE_TIER is refused here, not later
    _active = Watch(stall_after=stall_after, on_stall=on_stall, store=store, report_dir=report_dir, tick=tick,
                    gather=gather, node_tier=node_tier, launch_context=launch_context)
    atexit.register(_active.stop)
    return _active


def running() -> Optional[Watch]:
    """The watch() running in this process (the zero-code mode's, a framework hook's, the user's), if any."""
    return _active


def watch_from_environment(environ: Mapping[str, str] = os.environ,
                           launch_context: Optional[Callable[[], Any]] = None) -> Optional[Watch]:
    """The zero-code entry point: watch() when GPUGUARD_WATCH=1, with GPUGUARD_STALL_AFTER (seconds) and
    GPUGUARD_ON_STALL (report|raise) if set; None otherwise."""
    if environ.get("GPUGUARD_WATCH", "") in ("", "0"):
        return None
    raw = environ.get("GPUGUARD_STALL_AFTER", "")
    try:
        stall_after = float(raw) if raw else None
    except ValueError:
        raise ValueError(f"GPUGUARD_STALL_AFTER={raw!r}: give seconds, e.g. 300") from None
    return watch(stall_after, on_stall=environ.get("GPUGUARD_ON_STALL", "report"),
                 report_dir=environ.get("GPUGUARD_WATCH_DIR") or None, launch_context=launch_context)
