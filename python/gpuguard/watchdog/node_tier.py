"""The watchdog's per-node tier: which rank of a node asks the job's store for the others, and where they meet.

Healthy, every rank's watchdog asks the job's store once a tick whether an alarm was raised. With the tier, only
each node's leader (local rank 0) asks; it writes the answer to a page of shared memory (csrc/gpuguard/
node_relay.*) that the node's other ranks read instead. The job's steady traffic then grows with its nodes, not
its ranks. A follower asks the store itself whenever the page is missing or its answer is older than three ticks
(the leader died, is stopped, or cannot reach the store), so the tier never hides an alarm. Raising an alarm and
everything after it (each rank's progress and stack, the report) go to the store from every rank as without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

logger = logging.getLogger("gpuguard")

#: GPUGUARD_WATCH_NODE_TIER=1 turns the tier on at any size, 0 off; unset: on past AUTO_ABOVE_RANKS.
VARIABLE = "GPUGUARD_WATCH_NODE_TIER"
#: The pages' names begin with this. A leader removes its page when it stops; one killed leaves it, and the next
#: leader on the node removes pages nobody wrote for ABANDONED_AFTER_S seconds (and ten of their leader's ticks).
PAGE_PREFIX = "gpuguard-watch-"
ABANDONED_AFTER_S = 600.0


@dataclass(frozen=True)
class NodeTier:
    """This rank's place in the tier: the node's page, and whether this rank writes it."""
    path: str
    leader: bool
    local_world_size: int


def wanted(choice: Optional[bool], world_size: int, auto_above: int,
           environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to use the tier: ``choice`` when given, else GPUGUARD_WATCH_NODE_TIER, else past ``auto_above``
    ranks (a job that size would load its one store past what watch() allows itself with one check per rank)."""
    if choice is not None:
        return bool(choice)
    raw = environ.get(VARIABLE, "").strip()
    if raw in ("1", "0"):
        return raw == "1"
    if raw:
        raise ValueError(f"{VARIABLE}={raw!r}: use 1 (each node's leader asks the store for its node), 0 (every "
                         f"rank asks), or leave it unset (the tier past {auto_above:,} ranks)")
    return world_size > auto_above


def page_directory() -> str:
    """/dev/shm where the node has it (memory, never written to disk), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def place(store_host: str, store_port: int, prefix: str,
          launch_context: Optional[Callable[[], Any]]) -> Optional[NodeTier]:
    """This rank's place, from what the launcher says of its node (local rank and size, node rank); None, with
    the reason logged, when the launcher does not say or the node holds one rank (nothing to share).

    ``launch_context`` reads the launcher's LaunchContext (given by gpuguard.watch(), which composes the launchers
    and the watchdog: the watchdog imports no launcher)."""
    from ..errors import LaunchEnvironmentError

    if launch_context is None:
        logger.warning("gpuguard.watch: no per-node tier: no launch context was given to read this node's ranks from")
        return None
    try:
        context = launch_context()
    except LaunchEnvironmentError as exc:
        logger.warning("gpuguard.watch: no per-node tier: %s", exc)
        return None
    local_rank, local_size = context.local_rank, context.local_world_size
    if local_rank is None or local_size is None:
        logger.warning("gpuguard.watch: no per-node tier: the launcher (%s) does not say which ranks share this "
                       "node (no local rank and local world size); every rank asks the job's store", context.launcher)
        return None
    if local_size < 2:  # one rank on this node: nothing to share
        return None
    # The node: its host name and, where the launcher numbers nodes, its number (two agents on one host are two
    # nodes); the job: its store and this watch's keys. Every rank of the node computes the same name.
    node = f"{socket.gethostname()}/{'' if context.node_rank is None else context.node_rank}"
    digest = hashlib.sha256(f"{store_host}:{store_port}/{prefix}/{node}".encode()).hexdigest()[:24]
    return NodeTier(os.path.join(page_directory(), f"{PAGE_PREFIX}{digest}"), local_rank == 0, local_size)


def remove_abandoned(tier: NodeTier) -> int:
    """For a leader about to create its page: removes the pages killed leaders left beside it (how many)."""
    from .._core import remove_abandoned_relays

    return remove_abandoned_relays(os.path.dirname(tier.path), PAGE_PREFIX, ABANDONED_AFTER_S)
