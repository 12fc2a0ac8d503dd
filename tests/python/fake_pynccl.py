"""FakePyNccl: a test helper doing what a PyNccl user (vLLM's PyNcclCommunicator) does, over ctypes.

It drives the libraries named by GPUGUARD_LIBCUDA and GPUGUARD_LIBNCCL (in tests, the fakes of tests/fakes): the
primary context of its device, a stream of its own (non-blocking, as torch creates its streams), the unique id
passed through a torch.distributed store, ncclCommInitRank, and all-reduces enqueued on that stream which, as
on a GPU, complete later -- at a host sync, or never when NCCL hangs.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
NCCL_SUCCESS = 0
NCCL_FLOAT32 = 7
NCCL_SUM = 0
FLOAT_BYTES = 4


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


class FakePyNcclError(RuntimeError):
    """A CUDA driver or NCCL call failed: the message names the call and the library's error."""


def _signatures(cuda: ctypes.CDLL, nccl: ctypes.CDLL) -> None:
    vp, i, u, sz, ull = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_ulonglong
    P = ctypes.POINTER
    for lib, name, args in [
        (cuda, "cuInit", [u]),
        (cuda, "cuDeviceGet", [P(i), i]),
        (cuda, "cuDevicePrimaryCtxRetain", [P(vp), i]),
        (cuda, "cuCtxSetCurrent", [vp]),
        (cuda, "cuStreamCreate", [P(vp), u]),
        (cuda, "cuStreamQuery", [vp]),
        (cuda, "cuStreamSynchronize", [vp]),
        (cuda, "cuEventCreate", [P(vp), u]),
        (cuda, "cuEventRecord", [vp, vp]),
        (cuda, "cuEventQuery", [vp]),
        (cuda, "cuMemAlloc_v2", [P(ull), sz]),
        (cuda, "cuMemcpyHtoD_v2", [ull, vp, sz]),
        (cuda, "cuMemcpyDtoH_v2", [vp, ull, sz]),
        (nccl, "ncclGetUniqueId", [P(NcclUniqueId)]),
        (nccl, "ncclCommInitRank", [P(vp), i, NcclUniqueId, i]),
        (nccl, "ncclAllReduce", [vp, vp, sz, i, i, vp, vp]),
        (nccl, "ncclCommGetAsyncError", [vp, P(i)]),
        (nccl, "ncclCommAbort", [vp]),
    ]:
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    nccl.ncclGetErrorString.argtypes = [ctypes.c_int]
    nccl.ncclGetErrorString.restype = ctypes.c_char_p


class FakePyNccl:
    """One rank of an NCCL communicator used as vLLM's PyNcclCommunicator uses it.

    ``FakePyNccl(rank, world_size, store, local_rank=None)`` initialises CUDA, makes the primary context of device
    ``local_rank`` (default: ``rank``) current, creates its stream (``stream``: the CUstream as an int, as
    ``torch.cuda.Stream.cuda_stream`` gives it), exchanges the unique id through ``store`` (rank 0 sets
    ``key``, the others get it) and forms the communicator with the blocking ncclCommInitRank.
    """

    def __init__(self, rank: int, world_size: int, store: Any, local_rank: Optional[int] = None,
                 key: str = "fake_pynccl/unique_id") -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = rank if local_rank is None else local_rank
        self._cuda = ctypes.CDLL(os.environ["GPUGUARD_LIBCUDA"])
        self._nccl = ctypes.CDLL(os.environ["GPUGUARD_LIBNCCL"])
        _signatures(self._cuda, self._nccl)
        self._buffers: list[tuple[int, int]] = []  # (device pointer, element count), one per all-reduce
        self._cu("cuInit", 0)
        device = ctypes.c_int()
        self._cu("cuDeviceGet", ctypes.byref(device), self.local_rank)
        self._context = ctypes.c_void_p()
        self._cu("cuDevicePrimaryCtxRetain", ctypes.byref(self._context), device)
        self._make_current()
        stream = ctypes.c_void_p()
        self._cu("cuStreamCreate", ctypes.byref(stream), CU_STREAM_NON_BLOCKING)
        self.stream: int = stream.value or 0
        unique_id = NcclUniqueId()
        if rank == 0:
            self._nc("ncclGetUniqueId", ctypes.byref(unique_id))
            store.set(key, bytes(unique_id.internal))
        else:
            ctypes.memmove(unique_id.internal, store.get(key), ctypes.sizeof(unique_id))
        self._comm = ctypes.c_void_p()
        self._nc("ncclCommInitRank", ctypes.byref(self._comm), world_size, unique_id, rank)

    def all_reduce(self, values: list[float]) -> None:
        """Enqueues a float32 sum of ``values`` across the ranks on ``stream`` and returns at once, as NCCL does."""
        self._make_current()
        count = len(values)
        pointer = ctypes.c_ulonglong()
        # a buffer per call: the copy in is synchronous, and must not overwrite one a pending all-reduce reads
        self._cu("cuMemAlloc_v2", ctypes.byref(pointer), count * FLOAT_BYTES)
        host = (ctypes.c_float * count)(*values)
        self._cu("cuMemcpyHtoD_v2", pointer, host, count * FLOAT_BYTES)
        self._buffers.append((pointer.value, count))
        self._nc("ncclAllReduce", pointer.value, pointer.value, count, NCCL_FLOAT32, NCCL_SUM, self._comm,
                 self.stream)

    def synchronize(self) -> None:
        """cuStreamSynchronize on the stream: blocks like torch.cuda.synchronize() (forever, for a hung NCCL)."""
        self._make_current()
        self._cu("cuStreamSynchronize", self.stream)

    def query(self) -> bool:
        """cuStreamQuery: whether everything enqueued on the stream has completed."""
        self._make_current()
        return self._ready("cuStreamQuery", self.stream)

    def record_event(self) -> int:
        """A CUDA event recorded on the stream now (the CUevent as an int)."""
        self._make_current()
        event = ctypes.c_void_p()
        self._cu("cuEventCreate", ctypes.byref(event), CU_EVENT_DISABLE_TIMING)
        self._cu("cuEventRecord", event, self.stream)
        return event.value or 0

    def event_done(self, event: int) -> bool:
        """cuEventQuery: whether the work enqueued before the event was recorded has completed."""
        self._make_current()
        return self._ready("cuEventQuery", event)

    def result(self) -> list[float]:
        """The last all-reduce's buffer, read back (cuMemcpyDtoH); meaningful after synchronize()."""
        self._make_current()
        pointer, count = self._buffers[-1]
        host = (ctypes.c_float * count)()
        self._cu("cuMemcpyDtoH_v2", host, pointer, count * FLOAT_BYTES)
        return list(host)

    def async_error(self) -> int:
        """ncclCommGetAsyncError: the communicator's state (0 ncclSuccess), not a collective's progress."""
        state = ctypes.c_int(-1)
        self._nc("ncclCommGetAsyncError", self._comm, ctypes.byref(state))
        return state.value

    def abort(self) -> None:
        """ncclCommAbort: the communicator goes, and its collectives in flight end (a blocked sync returns)."""
        if self._comm.value:
            self._nc("ncclCommAbort", self._comm)
            self._comm = ctypes.c_void_p()

    def _make_current(self) -> None:
        # the current context is per thread, as torch's device guard knows
        self._cu("cuCtxSetCurrent", self._context)

    def _cu(self, name: str, *args: Any) -> None:
        rc = getattr(self._cuda, name)(*args)
        if rc != CUDA_SUCCESS:
            raise FakePyNcclError(f"CUDA driver call {name} failed: CUresult {rc}")

    def _ready(self, name: str, handle: int) -> bool:
        rc = getattr(self._cuda, name)(handle)
        if rc not in (CUDA_SUCCESS, CUDA_ERROR_NOT_READY):
            raise FakePyNcclError(f"CUDA driver call {name} failed: CUresult {rc}")
        return rc == CUDA_SUCCESS

    def _nc(self, name: str, *args: Any) -> None:
        rc = getattr(self._nccl, name)(*args)
        if rc != NCCL_SUCCESS:
            text = self._nccl.ncclGetErrorString(rc).decode(errors="replace")
            raise FakePyNcclError(f"NCCL call {name} failed: {text} ({rc})")
