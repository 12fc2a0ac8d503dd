"""One Ray cluster starting at a time among the test processes on this machine (pytest -n 2 runs two tests at once).

Two clusters starting together on CI's two cores left one dashboard agent 36 s to start: its raylet died waiting for
it, and ray.init() gave up after its 30 s, which Ray 2.60 hard-codes (the CI run of 8042364). So a cluster starts
while this process holds a lock that every pytest process on the machine shares:

    starting_alone()       around a start the test itself makes and waits for: ray.init() in the test's own
                           process, `ray start --head` (RayHead.start)
    until_a_driver_joins() from a test's start until a Ray driver that began after it has joined its cluster (a new
                           python-core-driver log in a session folder: the driver's ray.init() had its node), or the
                           test's end, or HOLD_S: for clusters that a driver script the test runs starts itself

The lock is re-entrant within a process (a test holding it may call RayHead.start). No one waits for it longer than
WAIT_S: a start that takes longer failed, and its test says so.

Ray also starts its workers 15 nice levels below its raylet (worker_niceness, in Ray 2.43 and 2.60 alike): beside
other tests' busy processes, an actor importing torch at nice 15 (19 under CI's nice-10 lane) waited out Ray's own
deadlines. ``workers_at_the_tests_priority`` gives the tests' clusters workers at the priority of the test.
"""

from __future__ import annotations

import fcntl
import glob
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .procs import wait_until

#: The lock file: in the system's temp folder, shared by every pytest process and lane on the machine.
LOCK_PATH = Path(tempfile.gettempdir()) / "gpuguard-tests-ray-start.lock"
#: The longest a test holds the lock waiting for a driver to join (a driver script's start took 8-25 s on CI).
HOLD_S = 90.0
#: The longest anyone waits for the lock: a holder's HOLD_S, or `ray start --head` bounded by RayHead's 180 s.
WAIT_S = 240.0
#: Where Ray writes its sessions: ray.init()'s default, RayHead's own temp folders (--temp-dir), and the folders that
#: jobs given a RAY_TMPDIR of their own start their clusters in (test_verl).
DRIVER_LOGS = ("/tmp/ray/session_*/logs/python-core-driver-*", "/tmp/gg-ray-*/session_*/logs/python-core-driver-*",
               "/tmp/gg-ray-*/ray/session_*/logs/python-core-driver-*")

_guard = threading.Lock()
_depth = 0
_fd = -1


def try_lock(fd: int) -> bool:
    """Takes the lock through the open file ``fd`` if no other open file of it holds the lock (flock: another
    open() of the same file counts as another holder, in this process too)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _acquire(wait_s: float) -> None:
    global _depth, _fd
    with _guard:
        if _depth:
            _depth += 1
            return
    fd = os.open(LOCK_PATH, os.O_CREAT | os.O_RDWR, 0o666)
    if not wait_until(lambda: try_lock(fd), wait_s, interval=0.2, what=None):
        os.close(fd)
        raise TimeoutError(f"another test's Ray cluster was still starting after {wait_s:.0f} s "
                           f"(lock {LOCK_PATH}); its test's output says why")
    with _guard:
        _fd, _depth = fd, 1


def _release() -> None:
    global _depth, _fd
    with _guard:
        if not _depth:
            return
        _depth -= 1
        if _depth:
            return
        fd, _fd = _fd, -1
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextmanager
def starting_alone(wait_s: float = WAIT_S) -> Iterator[None]:
    """Holds the lock while the body starts a cluster and waits for it."""
    _acquire(wait_s)
    try:
        yield
    finally:
        _release()


def driver_logs(changed_since: float = 0.0) -> set[str]:
    """The drivers' logs in every session folder, or only in the logs folders changed since ``changed_since``
    (seconds since the epoch): a new log changes its folder's mtime, and the look at every folder of every session
    left in /tmp/ray (Ray keeps them; about 200 here, 30 ms a look) costs a test 12 % of a core at four a second."""
    found = set()
    for pattern in DRIVER_LOGS:
        folder, name = os.path.split(pattern)
        for logs in glob.glob(folder):
            try:
                if os.stat(logs).st_mtime < changed_since:
                    continue
            except OSError:
                continue
            found.update(glob.glob(os.path.join(logs, name)))
    return found


@contextmanager
def until_a_driver_joins(hold_s: float = HOLD_S, wait_s: float = WAIT_S) -> Iterator[None]:
    """Holds the lock from here until a driver that began after this point has joined a cluster, or the body
    ends, or ``hold_s`` passed."""
    _acquire(wait_s)
    before = driver_logs()  # all of them, once: a folder changed by other files shows its old drivers' logs too
    began = time.time() - 1.0  # a whole second of slack for a file system's coarse mtimes
    done = threading.Event()
    once = threading.Lock()  # the watcher and the body's end: whichever takes it first releases

    def release_once() -> None:
        if once.acquire(blocking=False):
            _release()

    def watch() -> None:
        deadline = time.monotonic() + hold_s
        while not done.wait(0.25):
            if time.monotonic() > deadline or driver_logs(began) - before:
                release_once()
                return

    watcher = threading.Thread(target=watch, name="gg-ray-start", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        release_once()


#: Ray's exception when its node did not come up within its driver's fixed start-up wait (ray/_private/node.py:
#: 30 s for the raylet to register, "Failed to get node info b'RPC error: Deadline Exceeded'" before it), which a
#: loaded 2-core machine overran twice in CI (374603f, 054b1f9) before any gpuguard code ran.
RAY_START_TIMED_OUT = "The current node timed out during startup."


def ray_start_timed_out(returncode: int, output: str) -> bool:
    """Whether a driver script that starts its own cluster (ray.init()) failed only because Ray's start did: then
    the test starts it once more, and any other failure, or a second one, still fails it."""
    return returncode != 0 and RAY_START_TIMED_OUT in output


def init_in_this_process(ray: Any, **options: Any) -> Any:
    """``ray.init(**options)`` for a cluster the test's own process starts, started once more when it failed only
    because Ray's start did (RAY_START_TIMED_OUT), as ray_start_timed_out lets a driver script's test do; any other
    failure, or a second one, is raised."""
    try:
        return ray.init(**options)
    except Exception as exc:
        if RAY_START_TIMED_OUT not in str(exc):
            raise
    ray.shutdown()
    return ray.init(**options)


def workers_at_the_tests_priority(environ: "os._Environ[str]" = os.environ) -> None:
    """Ray workers at the priority of the process that started their cluster (the variable Ray reads; a test run
    that sets it otherwise keeps its own)."""
    environ.setdefault("RAY_worker_niceness", "0")
