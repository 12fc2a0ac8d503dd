"""Each test's CPU seconds, as the JUnit property ``cpu_s``: the test process's own and that of the processes it
started and waited for (rank processes, launchers, drivers; their children too, once waited for). CI's machines are
CPU-bound, so a test's wall time there says more about its neighbours than about it; .ci/report.py ranks by this.

A conftest takes the hooks by importing them (``from gg_testing.cpu_time import *``). What a test leaves running,
or what another process reaps (a daemon reparented to init: a Ray cluster's servers when nothing waits for them),
is not counted; a module's fixtures are counted in its first test, its teardown in its last.
"""

from __future__ import annotations

import resource
from typing import Iterator

import pytest

__all__ = ["pytest_runtest_setup", "pytest_runtest_makereport"]

_STARTED = pytest.StashKey[float]()  # the CPU seconds when the test's setup began


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of every child it has waited for, so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    if call.when == "teardown" and _STARTED in item.stash:
        item.user_properties.append(("cpu_s", f"{cpu_seconds() - item.stash[_STARTED]:.2f}"))
    yield
