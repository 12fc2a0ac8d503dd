"""The one free_port of the test suite: a port no other test process of this run can be handed, and that no
process binding port 0 can take between choosing it and using it.

A port the kernel hands out for port 0 lies in its ephemeral range, where any process binding port 0 (torch's
rendezvous, Ray's dozen servers, another helper's test run) may take it before the test binds it: CI once saw
"address already in use" that way. Below that range only a fixed choice can take it. pytest-xdist's workers each
choose from their own slice of it (PYTEST_XDIST_WORKER gwN), so two workers never choose the same port, and a
worker never hands out a port twice; each candidate is bound once to check that nothing else holds it now. Two
pytest runs at once (CI's wall-clock tests beside its other tests) each take a share first: GG_TEST_PORT_SHARE=i/n.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

LOWEST = 20000  # below: well-known and registered services (and Ray's, torch's and NCCL's defaults near 29500 are
#                 inside, which the bind check below steps over when something holds them)

_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def worker_slice() -> tuple[int, int]:
    """[first, end) of the ports this process may hand out: its xdist worker's share of those below the
    ephemeral range (the whole of it without xdist)."""
    low, end = LOWEST, ephemeral_range()[0]
    if end - low < 1000:  # a widened ephemeral range: fall back to a slice of the range above it
        end = low + 10000
    share, _, shares = os.environ.get("GG_TEST_PORT_SHARE", "0/1").partition("/")
    if share.isdigit() and shares.isdigit() and int(shares) > 0:  # this pytest run's share, then its workers'
        size = (end - low) // int(shares)
        low = low + (int(share) % int(shares)) * size
        end = low + size
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (end - low) // max(count, 1)
    first = low + (index % max(count, 1)) * size
    return first, first + size


def is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free now, in this worker's slice, never handed out before by this process."""
    first, end = worker_slice()
    for _ in range(2000):
        port = first + secrets.randbelow(end - first)
        if port in _handed_out or not is_free(port):
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {first} and {end} for this test process")
