"""The Python, PyTorch and Ray versions gpuguard supports (CI tests the corners), and the message for one outside.

One place for the range: the build reads it (cmake/torch_build_flags.py refuses a torch below it), the package
checks Python at import, Ray at its first Ray call, and README.md, docs/versions.md and pyproject.toml state it
(tests/python/test_supported_versions.py holds them to this file). Standard library only, no import of torch or
Ray: the build runs this file on its own.

What changes inside the range, and where gpuguard copes with it (what; where it changes: how gpuguard handles it):

- BaseException.add_note, and Python printing __notes__. Python 3.11: errors.add_note(exc, text) (3.10: the same
  __notes__ list); errors.format_exception prints notes on 3.10 (the excepthooks use it, and print the notes after a
  foreign hook); on 3.10 a GpuGuardError's str() carries its notes, so Ray's remote tracebacks, logging and
  torchrun's error files show them.
- _Py_DumpTracebackThreads exported (the watchdog's GIL-free stacks). Exported by 3.11 and 3.12 only:
  csrc/python/core/watch.cc looks it up at run time; on 3.10 and 3.13 watchdog/stacks.py registers faulthandler on
  SIGRTMAX-2, whose handler runs the same dumper when the watchdog's thread signals itself (a program holding that
  signal keeps it; the report then says why it has no stack). On 3.13 the recorder's call site ("issued it at ...")
  is still missing in test_watch.py's flight-recorder case (not in CI's corners).
- init_process_group(device_id=). Takes a torch.device only on 2.6; an int too on 2.10 and 2.15:
  binding/process_group.py passes a torch.device; the zero-code wrapper reads either (auto/device_index.index_of).
- the flight recorder. 2.6 and 2.10: off unless TORCH_NCCL_TRACE_BUFFER_SIZE > 0 when torch creates it (watch() sets
  it when it starts before the first process group; from 2.11 the default is 2000); 2.6: NCCL only, no control-plane
  handler header in the wheel, no _dump_fr_trace; 2.15: TORCH_FR_BUFFER_SIZE, gloo and hooked backends
  (dump_fr_trace_json), NCCL's dump_nccl_trace_json handler: libtorch/flight_recorder_reader.cc compiles each reader
  only where the header/version has it; watchdog/recorder.py picks the recorder where a dump with pg_status comes
  back, else the wrappers, and the report says why (docs/hangs.md's table).
- private torch.distributed names: distributed_c10d._get_default_store, _get_default_group, _get_process_group_name,
  _world.pg_names, ProcessGroup.group_desc, torch._C._distributed_c10d._dump_nccl_trace, _dump_fr_trace. All present
  on 2.6, 2.10 and 2.15 except _dump_fr_trace (2.10 and 2.15, not 2.6): watchdog/recorder.py tries _dump_fr_trace
  only where it exists; the others are read with getattr defaults where a missing one would only lose a name.
- DDP's signature. init_sync inserted after broadcast_buffers (absent on 2.6, present on 2.10 and 2.15), moving
  process_group and later positional arguments: auto/group_check.chosen_by_wrapper reads only device_ids by position
  (first after the module on every version), the rest by keyword.
- FSDP / FSDP2. FSDP's device_id is keyword-read on all; FSDP2's fully_shard is public in torch.distributed.fsdp
  from 2.6 and gains ignored_params, dp_mesh_dims by 2.15: gpuguard wraps FullyShardedDataParallel.__init__;
  fully_shard is a function it does not wrap: the group's first collective (FSDP2's all-gather through
  torch.distributed) triggers the check.
- torch's C++ ABI and pybind11 flags. 2.6's wheels: old ABI (_GLIBCXX_USE_CXX11_ABI=0) and torch._C._PYBIND11_* set;
  2.10 and 2.15: new ABI, no _PYBIND11_* (pybind11 3 keeps its ABI itself): cmake/torch_build_flags.py reads both
  from the torch built against; every compiled part takes the ABI (GoogleTest compiled from source for the old one);
  cmake/check_module_loads.py loads each module after linking.
- a torch upgraded after the build. Any: _libtorch_loader: the build record (one per Python) names the torch it was
  built for; tensors.implementation then gives tensors/_python_checks (the same checks and reports in Python) after one
  warning "built for PyTorch X, but Y is installed ... Rebuild"; _core (no torch) keeps working
  (tests/python/test_torch_mismatch.py builds against 2.6 and imports under 2.11 in CI, and removes _libtorch from a
  copy). A binary wheel carries a _libtorch per torch minor (_torch/torch<major>_<minor>/), the installed minor's
  chosen at import; a torch newer than every variant gets the Python checks, one warning naming the variants
  (tests/python/test_wheel_variants.py).
- NCCL's duplicate-GPU wording. NCCL ≤ 2.29 ("Duplicate GPU detected"; torch 2.6 ships 2.21.5, 2.10 ships 2.27.5) vs
  ≥ 2.30 ("Multiple Ranks are using the same GPU/Partition"; torch 2.15 ships 2.30):
  logs/recognisers/duplicate_gpu.py reads both; DuplicateDeviceError quotes both.
- Ray Train's default. V1 on 2.43 (RAY_TRAIN_V2_ENABLED defaults to 0), V2 on 2.60: ray/store.in_ray_train_worker:
  V2's train context, or a frame of ray.train.torch.config/train_loop_utils (V1 forms the group before its session
  exists).
- Ray's runtime_env. worker_process_setup_hook and env_vars on every Ray in range: ray/setup_hook.py,
  ray/placement.py (merges env_vars, keeps the other fields).
- Ray wheels for Python 3.13. From Ray 2.45: stated in docs/versions.md.
"""

from __future__ import annotations

import sys
from typing import Optional

# (oldest, newest supported) as (major, minor): CI's corners run both ends of each range but Python's, whose newest
# is supported untested (PYTHON_NEWEST_IN_CI is the newest a corner runs; docs/versions.md). The floors and why:
#   Python 3.10: what torch 2.6 and the frameworks built on it (verl, EasyR1) run; 3.9 is past its end of life.
#   torch 2.6: the oldest torch the frameworks gpuguard protects still pin (verl, EasyR1: 2.6-2.7 through 2025);
#     torch.load before 2.6 runs arbitrary code even with weights_only=True (CVE-2025-32434); FSDP2's
#     fully_shard is public from 2.6. Its wheels use the old C++ ABI, which the build follows.
#   Ray 2.43: the Ray of the torch 2.6 generation (February 2025); every Ray from 2.39 gives actors in
#     placement-group bundles the GPU ids of their bundle (older ones can seat two ranks on one GPU with
#     fractional GPUs), and runtime_env's worker_process_setup_hook, which `gpuguard.ray.setup` plugs into, is
#     there. Ray publishes Python 3.13 wheels from 2.45 on.
PYTHON = ((3, 10), (3, 13))
TORCH = ((2, 6), (2, 15))
RAY = ((2, 43), (2, 60))
RAY_FOR_PYTHON_3_13 = (2, 45)
# The newest Python one of .ci/run's corners runs (test_supported_versions holds it to .ci/run).
PYTHON_NEWEST_IN_CI = (3, 12)


def _text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.6.0+cu124' or '2.43.0rc1'."""
    parts = version.split("+", 1)[0].split(".")
    digits = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:2]]
    return (digits + [0, 0])[0], (digits + [0, 0])[1]


def stated(name: str) -> str:
    """'PyTorch 2.6 to 2.15' and the like: the range as README.md, docs/versions.md and the messages state it."""
    oldest, newest = {"Python": PYTHON, "PyTorch": TORCH, "Ray": RAY}[name]
    return f"{name} {_text(oldest)} to {_text(newest)}"


def python_problem(version: tuple[int, int] = (sys.version_info[0], sys.version_info[1])) -> Optional[str]:
    """Why gpuguard cannot run on Python ``version``, or None: the supported range as docs/versions.md states it, and
    an interpreter to use that CI tests."""
    if version < PYTHON[0]:
        return (f"gpuguard needs Python {_text(PYTHON[0])} or newer: it supports {stated('Python')} (CI tests "
                f"{_text(PYTHON[0])} to {_text(PYTHON_NEWEST_IN_CI)}); this is Python {_text(version)}. Use a newer "
                f"interpreter (for example a venv made with python{_text(PYTHON_NEWEST_IN_CI)}).")
    return None


def torch_problem(version: str) -> Optional[str]:
    """Why a torch of ``version`` cannot be built against, or None. Newer than tested is allowed (see newer())."""
    if release(version) < TORCH[0]:
        return (f"gpuguard supports {stated('PyTorch')}; this Python has torch {version}. Upgrade it "
                f"(pip install 'torch>={_text(TORCH[0])}'), then build gpuguard again against it.")
    return None


def ray_problem(version: str) -> Optional[str]:
    """Why Ray ``version`` cannot serve gpuguard's Ray integration, or None."""
    if release(version) < RAY[0]:
        return (f"gpuguard's Ray integration supports {stated('Ray')}; this Python has Ray {version}. Upgrade it: "
                f"pip install 'ray[default]>={_text(RAY[0])}'.")
    return None


def newer(name: str, version: str) -> Optional[str]:
    """A warning for a release newer than the newest tested, or None."""
    newest = {"Python": PYTHON, "PyTorch": TORCH, "Ray": RAY}[name][1]
    if release(version) > newest:
        return (f"{name} {version} is newer than gpuguard has been tested with ({stated(name)}); it should work, "
                f"and gpuguard doctor reports what it can check.")
    return None
