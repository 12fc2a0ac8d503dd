"""gpuguard doctor: a report on this machine and process that a user can paste into an issue as it is.

One fact a line, versions first; "not checked: X: because Y" instead of a crash; findings last, each with a
severity and a fix. The probes that can hang (a real peer copy, an NCCL all-reduce) run in child processes
under a deadline. Nothing here initialises CUDA through torch: the driver is reached through gpuguard's own
loader, as devices() does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .system.devices import CudaStatus, Device, cuda_status, devices
from .errors import LaunchEnvironmentError, RankMappingError
from .binding.visible_devices import VisibilityProblem, VisibleDevices, parse_visible_devices, rejected_entry

SCHEMA = "gpuguard.doctor/1"
SEVERITIES = ("error", "warning", "info")

# Settings that change how NCCL and CUDA place or move data; printed when set.
SETTINGS = ("CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
            "NCCL_MULTI_RANK_GPU_ENABLE", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "HIP_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Finding:
    """Something the report found: how bad (error / warning / info), what, and the fix."""

    severity: str
    code: str
    message: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "message": self.message, "fix": self.fix}


@dataclass
class DoctorReport:
    versions: dict[str, Optional[str]] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)
    launcher: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    cuda: Optional[CudaStatus] = None
    visible: Optional[VisibleDevices] = None
    visible_problem: Optional[VisibilityProblem] = None
    devices: list[Device] = field(default_factory=list)
    binding: Optional[dict[str, Any]] = None
    gpu_processes: Optional[list[dict[str, Any]]] = None  # per visible GPU: NVML's compute processes
    peer_access: Optional[list[list[Optional[bool]]]] = None
    p2p: Optional[dict[str, Any]] = None
    nccl: Optional[dict[str, Any]] = None
    nccl_libraries: Optional[dict[str, Any]] = None  # gpuguard's NCCL and torch's; "same": one file
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def not_checked(self, what: str, why: str) -> None:
        self.unchecked.append((what, why))

    def find(self, severity: str, code: str, message: str, fix: str = "") -> None:
        assert severity in SEVERITIES, severity
        self.findings.append(Finding(severity, code, message, fix))

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "versions": self.versions,
            "nccl_libraries": self.nccl_libraries,
            "host": self.host,
            "launcher": self.launcher,
            "settings": self.settings,
            "cuda": self.cuda.as_dict() if self.cuda else None,
            "cuda_visible_devices": _visibility_dict(self.visible, self.visible_problem),
            "devices": [d.as_dict() for d in self.devices],
            "binding": self.binding,
            "gpu_processes": self.gpu_processes,
            "peer_access": self.peer_access,
            "p2p": self.p2p,
            "nccl": self.nccl,
            "not_checked": [{"what": w, "why": y} for w, y in self.unchecked],
            "findings": [f.as_dict() for f in sorted(self.findings, key=_severity_order)],
            "exit_code": self.exit_code,
        }


def _severity_order(f: Finding) -> int:
    return SEVERITIES.index(f.severity)


def _ignored_entries(v: VisibleDevices, problem: Optional[VisibilityProblem]) -> list[str]:
    if v.raw is None or problem is None:
        return []
    return [e.strip() for e in v.raw.split(",")[problem.position + 1:]]


def _visibility_dict(v: Optional[VisibleDevices], problem: Optional[VisibilityProblem]) -> Optional[dict[str, Any]]:
    if v is None:
        return None
    return {
        "raw": v.raw,
        "set": v.set,
        "honoured": [e.as_dict() for e in (v.entries[:problem.position] if problem else v.entries)],
        "problem": None if problem is None else problem.as_dict(),
        "ignored": _ignored_entries(v, problem),
        "hides_all_on_purpose": v.hides_all_on_purpose,
    }


# ---- collecting ------------------------------------------------------------------------------------------

def _versions(report: DoctorReport) -> None:
    from ._libtorch_loader import TORCH_VERSION_BUILT_FOR
    from ._version import __version__
    from .system.installed_torch import installed_torch

    report.versions["gpuguard"] = __version__
    report.versions["gpuguard built for torch"] = TORCH_VERSION_BUILT_FOR
    report.versions["python"] = f"{platform.python_version()} ({platform.python_implementation()})"
    torch = installed_torch()  # read from its files: doctor never imports torch
    report.versions["torch"] = torch.version if torch else "not installed"
    report.versions["torch CUDA build"] = ((torch.cuda or "none (CPU-only build of torch)") if torch else
                                           "none (torch is not installed)")
    _nccl_libraries(report, torch)
    try:
        report.versions["ray"] = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        report.versions["ray"] = "not installed"


def _nccl_libraries(report: DoctorReport, torch: Any) -> None:
    """gpuguard's NCCL (loaded as its probes load it, gpuguard.system.nccl_library) and torch's (read from torch's files),
    each with its version and path; a warning when they are not the same file. Neither initialises CUDA nor
    imports torch."""
    from .system.nccl_library import nccl_status, torch_nccl, wheel_version_of

    status = nccl_status()
    theirs = torch_nccl(torch)
    ours_path = os.path.realpath(status.library) if status.loaded else None
    same: Optional[bool] = None
    if status.loaded:
        report.versions["NCCL (gpuguard's)"] = f"{status.version_string} ({status.library}, {status.found_by})"
    else:
        report.versions["NCCL (gpuguard's)"] = None
        report.not_checked("NCCL (gpuguard's)", status.reason)
    torch_entry: dict[str, Any] = {"library": None, "version": None, "wheel": None, "how": None, "static": False}
    if torch is None:
        report.versions["NCCL (torch's)"] = "none (torch is not installed)"
    elif theirs is None:
        report.versions["NCCL (torch's)"] = "none (CPU-only build of torch)"
    else:
        torch_entry.update(theirs.as_dict())
        if theirs.library is not None:
            wheel = wheel_version_of(theirs.library)
            same = ours_path is not None and ours_path == os.path.realpath(theirs.library)
            version = status.version_string if same else (wheel[1] if wheel else "version unknown")
            torch_entry.update(version=version, wheel=wheel[0] if wheel else None)
            report.versions["NCCL (torch's)"] = (f"{version} ({theirs.library}, "
                                                 + (f"its {wheel[0]} wheel, " if wheel else "") + f"{theirs.how})")
        elif theirs.static:
            report.versions["NCCL (torch's)"] = f"built into torch, {theirs.how}"
        else:
            report.versions["NCCL (torch's)"] = f"whichever libnccl.so.2 the loader finds ({theirs.how})"
    report.nccl_libraries = {"gpuguard": status.as_dict(), "torch": torch_entry, "same": same}
    if same is False:
        _nccl_not_torchs(report, status, theirs, torch_entry)
    elif theirs is not None and theirs.static and status.loaded:
        report.find("info", "nccl_linked_into_torch", f"torch's NCCL is {theirs.how}: no other library can load "
                    f"that copy, so gpuguard's NCCL checks run on NCCL {status.version_string} ({status.library}) "
                    "instead, and their verdict holds for torch's NCCL only as far as the two agree.")


def _nccl_not_torchs(report: DoctorReport, status: Any, theirs: Any, torch_entry: dict[str, Any]) -> None:
    """Two NCCLs: the finding says which one the job uses, what that costs, and the fix for how it happened."""
    message = (f"gpuguard's NCCL is not torch's: gpuguard loaded NCCL {status.version_string} from "
               f"{status.library} ({status.found_by}), but torch loads NCCL {torch_entry['version']} from "
               f"{theirs.library}. The job's collectives run on torch's, so gpuguard's NCCL checks (verify_nccl, "
               "doctor --nccl, the unique-id exchange) test a library the job does not use. And where gpuguard "
               "loads its copy first in a process (bind() before import torch), torch binds to that copy "
               "instead of its own: the dynamic loader reuses a loaded libnccl.so.2.")
    if status.found_by.startswith("$GPUGUARD_LIBNCCL"):
        fix = f"Unset GPUGUARD_LIBNCCL, or set it to torch's: export GPUGUARD_LIBNCCL={theirs.library}"
    elif status.already_in_process:
        fix = ("Another library loaded its NCCL before torch in this process: import torch before it, so that "
               "both use torch's.")
    else:
        fix = (f"Check that {theirs.library} loads (its error is quoted above); reinstall torch's NCCL wheel "
               f"({torch_entry['wheel'] or 'nvidia-nccl'}) if it does not.")
    report.find("warning", "nccl_not_torchs", message, fix)


def _launcher(report: DoctorReport) -> Any:
    """The launch context as bind() reads it (gpuguard.detect_launcher); contradicting variables are an error."""
    from .binding.launchers import detect

    for key in SETTINGS:
        if key in os.environ:
            report.settings[key] = os.environ[key]
    try:
        context = detect()
    except LaunchEnvironmentError as exc:
        report.launcher = {"error": str(exc)}
        report.find("error", "launcher_environment", str(exc),
                    "Correct or unset the variables it names; bind() refuses to start from them as they are.")
        return None
    report.launcher = context.as_dict()
    return context


def _visibility(report: DoctorReport) -> None:
    """CUDA_VISIBLE_DEVICES parsed as the driver reads it; an entry the driver drops is named, as bind() does."""
    v = parse_visible_devices()
    report.visible = v
    problem = v.problem
    if problem is None and v.set and report.cuda is not None and report.cuda.library_loaded:
        problem = rejected_entry(v.raw, [d.uuid for d in report.devices])
    report.visible_problem = problem
    if v.hides_all_on_purpose:
        report.find("info", "visible_devices_hide_all", f"{v.describe()} hides every GPU from this process.",
                    "Unset it (or list the GPUs) if this process should use a GPU.")
        return
    if problem is None:
        return
    from .binding.device_choice import check_visibility

    try:
        check_visibility(v, report.devices, report.cuda is not None and report.cuda.library_loaded)
        what, fix = f"{v.describe()}: {problem.reason}.", ""
    except LaunchEnvironmentError as exc:
        what, fix = exc.without_fix(), exc.fix
    report.find("error", "visible_devices_invalid", what, fix)


def _binding(report: DoctorReport, context: Any) -> None:
    """The GPU bind() would give this process, or the RankMappingError it would raise."""
    from .binding.device_choice import resolve_device

    if context is None or report.visible is None or report.visible_problem is not None:
        return
    try:
        res = resolve_device(context, report.devices, report.visible, host=socket.gethostname())
    except RankMappingError as exc:
        report.binding = {"device": None, "error": str(exc)}
        report.find("error", "rank_mapping", str(exc), "gpuguard.bind() applies the same rules and raises the "
                    "same error; fix the cause it names.")
        return
    d = res.device
    report.binding = {"device": None if d is None else d.index, "uuid": None if d is None else d.uuid,
                      "local_rank": res.local_rank, "local_rank_source": res.local_rank_source,
                      "chosen_by": res.chosen_by}


def _devices(report: DoctorReport) -> None:
    status = cuda_status()
    report.cuda = status
    if status.library_loaded:
        report.versions["CUDA driver"] = f"{status.driver_version_string} ({status.library})"
    else:
        report.versions["CUDA driver"] = None
        report.not_checked("CUDA driver", status.reason or "it could not be loaded")
    report.devices = devices() if status.library_loaded else []
    if not status.library_loaded:
        report.find("warning", "no_driver", f"No NVIDIA driver could be loaded ({status.reason}); every GPU check "
                    "was skipped.", "On a GPU machine, install the NVIDIA driver (nvidia-smi must work); on a CPU "
                    "machine, nothing to do.")
    elif not report.devices:
        report.not_checked("devices", status.reason or "the driver reports none")


def _gpu_processes(report: DoctorReport) -> None:
    """Per visible GPU, the compute processes NVML lists with their memory; the current user's that started before
    this login or job (the session leader of this process) are flagged as likely leftovers of an earlier run."""
    import pwd

    from .system.processes import ancestors, describe_pid, format_bytes, session_start, unlisted_memory, usage_of

    if not report.devices:
        return
    me = pwd.getpwuid(os.getuid()).pw_name if hasattr(os, "getuid") else ""
    since = session_start()
    mine = ancestors(os.getpid())
    rows: list[dict[str, Any]] = []
    for d in report.devices:
        usage, why = usage_of(d.uuid, d.pci_bus_id)
        if usage is None:
            report.not_checked("GPU processes", why)
            return
        processes = []
        for p in sorted(usage.processes, key=lambda p: -int(p.used_memory)):
            view = describe_pid(p.pid)
            stale = (view.visible and view.user == me and since is not None and view.started is not None
                     and view.started < since and p.pid not in mine)
            processes.append({"pid": p.pid, "bytes": int(p.used_memory) if p.used_memory >= 0 else None,
                              "description": view.describe(), "user": view.user or None, "started": view.started,
                              "older_than_session": bool(stale)})
            if stale:
                report.find("warning", "stale_gpu_process",
                            f"pid {p.pid} ({view.describe()}) holds {format_bytes(int(p.used_memory))} of GPU "
                            f"{d.index} ({d.uuid}) and started before this login or job "
                            f"({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}): likely left over "
                            f"from an earlier run of yours.",
                            f"If it is a leftover, end it (kill {p.pid}; kill -9 {p.pid} if it does not exit): it "
                            "holds that memory until it exits.")
        rows.append({"device": d.index, "uuid": d.uuid, "total_memory": int(usage.total_memory),
                     "used_memory": int(usage.used_memory), "free_memory": int(usage.free_memory),
                     "unlisted_memory": unlisted_memory(usage), "processes": processes})
    report.gpu_processes = rows


def _tensor_checks(report: DoctorReport) -> None:
    """Which implementation the tensor checks run (the compiled gpuguard._libtorch, or its Python twin when that
    cannot load) and why, judged from the files alone, as _libtorch_loader will decide."""
    from ._libtorch_loader import REINSTALL, WHEEL_FIX, choice, source_build
    from .system.installed_torch import installed_torch

    torch = installed_torch()
    if torch is None:
        report.versions["tensor checks"] = "none (torch is not installed)"
        report.not_checked("tensor checks", "torch is not installed")
        return
    slower = ("assert_same_device, same_device, guard and find_device_mismatch run in Python instead: the same checks "
              "and reports, slower.")
    chosen = choice(torch.version)
    if chosen.code == "tensor_checks_missing" or (chosen.build is not None and not chosen.build.module.is_file()):
        report.versions["tensor checks"] = "Python (gpuguard._libtorch is missing)"
        report.find("warning", "tensor_checks_missing", "gpuguard was built without its compiled tensor checks "
                    "(gpuguard._libtorch): " + slower, "Rebuild gpuguard with torch installed: " + REINSTALL)
        return
    if chosen.code == "torch_build_mismatch":
        built_for = source_build().torch_version
        report.versions["tensor checks"] = (f"Python (gpuguard._libtorch was built for PyTorch "
                                            f"{built_for}, not {torch.version})")
        report.find("warning", "torch_build_mismatch", f"gpuguard's tensor checks were built for PyTorch "
                    f"{built_for}, but PyTorch {torch.version} is installed: " + slower + " bind(), "
                    "the zero-code checks, watch() and the command line work as they are.",
                    "Rebuild gpuguard against this torch: " + REINSTALL)
        return
    if chosen.code == "no_variant_for_torch":
        report.versions["tensor checks"] = f"Python (this wheel has no gpuguard._libtorch for PyTorch {torch.version})"
        report.find("warning", "no_variant_for_torch", chosen.problem.split(". To have them:")[0] + ": " + slower
                    + " bind(), the zero-code checks, watch() and the command line work as they are.",
                    WHEEL_FIX[0].upper() + WHEEL_FIX[1:])
        return
    assert chosen.build is not None
    report.versions["tensor checks"] = ("C++ (gpuguard._libtorch)" if not chosen.build.variant else
                                        f"C++ (gpuguard._libtorch, the wheel's variant for PyTorch "
                                        f"{chosen.build.torch_version})")


def _torch_vs_driver(report: DoctorReport) -> None:
    from .system.installed_torch import installed_torch

    torch = installed_torch()
    if torch is None:
        return
    cuda_build = torch.cuda
    status = report.cuda
    if status is None or not status.library_loaded or not status.driver_version:
        return
    if not cuda_build:
        if report.devices:
            report.find("warning", "torch_cpu_only", f"torch {torch.version} is a CPU-only build, but this "
                        f"machine has {len(report.devices)} GPU(s).", "Install a CUDA build of torch "
                        "(https://pytorch.org/get-started/locally/).")
        return
    try:
        major, minor = (int(x) for x in cuda_build.split(".")[:2])
    except ValueError:
        report.not_checked("torch's CUDA version against the driver", f"cannot read torch.version.cuda={cuda_build!r}")
        return
    d_major, d_minor = status.driver_version // 1000, (status.driver_version % 1000) // 10
    if (major, minor) <= (d_major, d_minor):
        return
    if major > d_major:
        report.find("error", "driver_too_old", f"torch {torch.version} is built for CUDA {cuda_build}, but the "
                    f"driver supports CUDA {d_major}.{d_minor} at most: CUDA cannot start in torch.",
                    f"Upgrade the NVIDIA driver to one supporting CUDA {major}.x, or install a torch built for "
                    f"CUDA {d_major}.x.")
    else:
        report.find("warning", "driver_older_minor", f"torch is built for CUDA {cuda_build}, the driver supports "
                    f"CUDA {d_major}.{d_minor}: it runs through CUDA minor-version compatibility, but kernels that "
                    "need PTX JIT compilation fail.", f"Upgrade the driver to one supporting CUDA {cuda_build}.")


def _peer_access(report: DoctorReport) -> None:
    n = len(report.devices)
    if n < 2:
        if report.cuda is not None and report.cuda.library_loaded:
            report.not_checked("peer access", f"{n} GPU visible: peer access needs two")
        return
    from ._core import can_access_peer

    matrix: list[list[Optional[bool]]] = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            try:
                matrix[i][j] = bool(can_access_peer(i, j))
            except RuntimeError as exc:
                report.not_checked("peer access", str(exc))
                report.peer_access = None
                return
    report.peer_access = matrix
    no = [(i, j) for i in range(n) for j in range(n) if i != j and matrix[i][j] is False]
    if no:
        pairs = ", ".join(f"{i}->{j}" for i, j in no[:24]) + (" ..." if len(no) > 24 else "")
        report.find("info", "no_peer_access", f"The driver reports no peer access for {len(no)} ordered GPU "
                    f"pair(s) ({pairs}): NCCL moves data between them through host memory, more slowly.",
                    "Nothing to fix if these are PCIe cards without P2P support; on NVLink systems check "
                    "`nvidia-smi topo -m` and the fabric manager.")


def _p2p(report: DoctorReport, timeout: float) -> None:
    from .probes.run import peer_copy_all_pairs

    if len(report.devices) < 2:
        report.not_checked("peer copies (--p2p)", f"{len(report.devices)} GPU visible: a peer copy needs two")
        return
    result = peer_copy_all_pairs(timeout)
    report.p2p = result.as_dict()
    if result.failed_to_start:
        report.not_checked("peer copies (--p2p)", result.failed_to_start)
        return
    errors = [p for p in result.pairs if p.get("error")]
    dropped = [p for p in result.pairs if not p.get("error") and not p.get("verified")]
    for p in errors[:8]:
        report.find("error", "peer_copy_failed", f"Peer copy GPU {p['src']} -> GPU {p['dst']} failed: "
                    f"{p['error']['message']}", "Check `nvidia-smi topo -m` and the kernel log (dmesg) for PCIe "
                    "or NVLink errors on these GPUs.")
    if dropped:
        lying = [p for p in dropped if p.get("peer_access_reported")]
        pairs = ", ".join(f"{p['src']}->{p['dst']}" for p in dropped[:24])
        lost = sum(int(p.get("mismatched_bytes") or 0) for p in dropped)
        total = sum(int(p.get("bytes") or 0) for p in dropped)
        unchanged = all(p.get("destination_unchanged") for p in dropped)
        msg = (f"Peer copies report success but the data does not arrive on {len(dropped)} GPU pair(s) "
               f"({pairs}): {lost} of {total} bytes differ"
               + (", the destination untouched: peer writes are being dropped" if unchanged else "") + ".")
        if lying:
            msg += (f" The driver claims peer access for {len(lying)} of these pairs (cuDeviceCanAccessPeer): "
                    "the capability flag is wrong on this machine, and NCCL trusting it will hang or corrupt data.")
        report.find("error", "peer_writes_dropped", msg,
                    "PCIe ACS redirecting peer traffic, or an IOMMU not in passthrough, is the usual cause: disable "
                    "ACS on the PCIe switches (BIOS setting, or setpci) and boot with iommu=pt. Until then run "
                    "NCCL with NCCL_P2P_DISABLE=1 (`gpuguard doctor --nccl` checks that it is the cure).")
    if result.timed_out:
        where = (f" while copying GPU {result.hung_pair[0]} -> GPU {result.hung_pair[1]}"
                 if result.hung_pair else "")
        report.find("error", "peer_copy_hang", f"The peer copies did not finish within {timeout:g} s{where}: "
                    "GPU peer-to-peer hangs on this machine.", "Check `nvidia-smi topo -m` and dmesg; run NCCL "
                    "with NCCL_P2P_DISABLE=1 until P2P is fixed (`gpuguard doctor --nccl` checks that it helps).")
    if not errors and not dropped and not result.timed_out:
        peer = sum(1 for p in result.pairs if p.get("peer_access_enabled"))
        report.find("info", "peer_copies_verified", f"Peer copies verified byte for byte on all {len(result.pairs)} "
                    f"ordered GPU pairs ({peer} over the direct peer path, {len(result.pairs) - peer} staged "
                    "through host memory).")


def run_doctor(*, p2p: bool = False, nccl: bool = False, timeout: float = 30.0) -> DoctorReport:
    """Collects the report (``gpuguard.doctor``). Never raises for what it cannot check: that goes into
    ``not_checked``. Calls the CUDA driver (cuInit) through gpuguard, never through torch; the probes that
    can hang (``p2p``, ``nccl``) run in child processes, each under ``timeout`` seconds."""
    report = DoctorReport()
    report.host = {"hostname": socket.gethostname(), "os": f"{platform.system()} {platform.release()}",
                   "machine": platform.machine()}
    _versions(report)
    context = _launcher(report)
    _devices(report)
    _visibility(report)
    _binding(report, context)
    _gpu_processes(report)
    _torch_vs_driver(report)
    _tensor_checks(report)
    _settings_findings(report)
    _peer_access(report)
    if p2p:
        _p2p(report, timeout)
    if nccl:
        _nccl(report, timeout)
    return report


P2P_DISABLE_COST = ("NCCL then moves data between this node's GPUs through host memory instead of directly, so "
                    "intra-node collectives lose bandwidth: users report steps roughly 7-10 % slower, more for "
                    "communication-bound jobs. Measure your own step time with and without it.")


def _nccl(report: DoctorReport, timeout: float) -> None:
    from .logs.explainer import explain
    from .system.nccl_library import nccl_status
    from .probes.run import nccl_all_reduce

    n = len(report.devices)
    if n < 2:
        report.not_checked("NCCL all-reduce (--nccl)", f"{n} GPU visible: an all-reduce across GPUs needs two")
        return
    status = nccl_status()
    if not status.loaded:
        report.not_checked("NCCL all-reduce (--nccl)", f"NCCL could not be loaded: {status.reason}")
        return
    first = nccl_all_reduce(n, timeout, p2p_disabled=False)
    runs = [first]
    if first.verdict == "timed out":
        runs.append(nccl_all_reduce(n, timeout, p2p_disabled=True))
    report.nccl = {"runs": [r.as_dict() for r in runs],
                   "summary": {f"all-reduce over {n} GPUs, P2P {'disabled' if r.p2p_disabled else 'enabled'}":
                               f"{r.verdict} in {r.seconds:.1f} s" + (f": {r.problem}" if r.problem else "")
                               for r in runs}}
    user_disabled = report.settings.get("NCCL_P2P_DISABLE") not in (None, "", "0")
    if first.verdict == "ok":
        report.find("info", "nccl_ok", f"An NCCL all-reduce across {n} GPUs completed with P2P enabled "
                    f"({first.seconds:.1f} s including process start).")
        if user_disabled:
            report.find("warning", "p2p_disable_unneeded", "NCCL_P2P_DISABLE is set, but NCCL works here with P2P "
                        "enabled: the setting costs bandwidth for nothing. " + P2P_DISABLE_COST,
                        "unset NCCL_P2P_DISABLE")
        return
    if first.verdict == "failed":
        text = "\n".join(str((x.get("error") or {}).get("message", "")) + "\n" + str(x.get("last_error") or "")
                          for x in first.ranks)
        decoded = explain(text, match_local=False)
        msg = f"An NCCL all-reduce across {n} GPUs failed: {first.problem}."
        if decoded:
            msg += " gpuguard explain: " + " ".join(d.summary for d in decoded)
        report.find("error", "nccl_failed", msg, decoded[0].fix if decoded else
                    "Rerun with NCCL_DEBUG=INFO and read the first WARN line; `gpuguard explain` decodes it.")
        return
    second = runs[1]
    if second.verdict == "ok":
        report.find("error", "nccl_hangs_with_p2p", f"An NCCL all-reduce across {n} GPUs hangs with GPU "
                    f"peer-to-peer enabled ({first.problem}) and completes "
                    "with NCCL_P2P_DISABLE=1: peer-to-peer is broken on this machine, and disabling it is the "
                    "cure.", "export NCCL_P2P_DISABLE=1 for jobs on this machine. What it costs: "
                    + P2P_DISABLE_COST + " The lasting fix is the machine's: disable PCIe ACS / set the IOMMU to "
                    "passthrough, then rerun `gpuguard doctor --nccl` without the setting.")
    else:
        report.find("error", "nccl_hangs", f"An NCCL all-reduce across {n} GPUs does not complete with P2P enabled "
                    f"({first.problem}) nor with NCCL_P2P_DISABLE=1 ({second.verdict}: {second.problem}): "
                    "disabling P2P is not the cure here, so gpuguard does not recommend it.",
                    "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM to see the transport NCCL "
                    "chooses; in containers check the size of /dev/shm (docker --shm-size).")


def _settings_findings(report: DoctorReport) -> None:
    if report.settings.get("NCCL_P2P_DISABLE") not in (None, "", "0"):
        report.find("info", "p2p_disabled", "NCCL_P2P_DISABLE is set: NCCL moves intra-node data through host "
                    "memory instead of GPU peer-to-peer, which costs intra-node bandwidth (reported at around "
                    "7-10 % of step time in practice).",
                    "Keep it only if P2P is broken here: `gpuguard doctor --p2p --nccl` tells.")
    if "CUDA_DEVICE_ORDER" not in report.settings and len({d.name for d in report.devices}) > 1:
        report.find("info", "device_order", "This machine mixes GPU models and CUDA_DEVICE_ORDER is unset: CUDA "
                    "numbers the fastest GPU first while nvidia-smi numbers by PCI bus, so cuda:N and nvidia-smi's "
                    "GPU N may differ.", "export CUDA_DEVICE_ORDER=PCI_BUS_ID to make both agree.")


# ---- rendering -------------------------------------------------------------------------------------------

def format_report(report: DoctorReport) -> str:
    lines = ["gpuguard doctor: paste this report as it is into an issue", ""]
    for key, value in report.versions.items():
        lines.append(f"{key}: {value if value is not None else 'not checked'}")
    lines.append(f"host: {report.host.get('hostname')} ({report.host.get('os')}, {report.host.get('machine')})")
    launcher = report.launcher
    if "error" in launcher:
        lines.append("launcher: the variables contradict each other (see the error below)")
    elif launcher.get("launcher") == "single":
        lines.append("launcher: none seen (a single process: rank 0 of 1)")
    elif launcher:
        by_source: dict[str, list[str]] = {}
        for name, source in launcher["sources"].items():
            by_source.setdefault(source, []).append(name)
        where = "; ".join(f"{', '.join(names)} from {source}" for source, names in by_source.items())
        node = f", node rank {launcher['node_rank']}" if launcher["node_rank"] is not None else ""
        lines.append(f"launcher: {launcher['description']}: rank {launcher['rank']} of {launcher['world_size']}, "
                     f"local rank {launcher['local_rank']}{node}" + (f" ({where})" if where else ""))
    for key, value in report.settings.items():
        lines.append(f"{key}={value}")
    v = report.visible
    if v is None or not v.set:
        lines.append("CUDA_VISIBLE_DEVICES: unset (every GPU is visible)")
    else:
        problem = report.visible_problem
        lines.append(f"CUDA_VISIBLE_DEVICES: {v.raw!r}" + (" (hides every GPU)" if v.hides_all_on_purpose else ""))
        honoured = v.entries[:problem.position] if problem else v.entries
        for i, e in enumerate(honoured):
            lines.append(f"CUDA_VISIBLE_DEVICES entry {i + 1} {e.text!r}: {e.kind.replace('_', ' ')}, cuda:{i}")
        if problem is not None:
            lines.append(f"CUDA_VISIBLE_DEVICES entry {problem.position + 1} {problem.entry!r}: {problem.kind} "
                         f"({problem.reason})")
            for j, text in enumerate(_ignored_entries(v, problem)):
                lines.append(f"CUDA_VISIBLE_DEVICES entry {problem.position + 2 + j} {text!r}: ignored (the "
                             f"driver stopped at entry {problem.position + 1})")
    if report.cuda is not None and report.cuda.library_loaded:
        lines.append(f"devices visible: {len(report.devices)}"
                     + (f" ({report.cuda.reason})" if report.cuda.reason and not report.devices else ""))
    for d in report.devices:
        cc = f"{d.compute_capability[0]}.{d.compute_capability[1]}"
        lines.append(f"GPU {d.index}: {d.name}, {d.uuid}, {d.pci_bus_id}, {d.total_memory_gib:.1f} GiB, cc {cc}")
    if report.gpu_processes is not None:
        from .system.processes import format_bytes

        for row in report.gpu_processes:
            listed = "; ".join(f"pid {p['pid']} {format_bytes(p['bytes'] if p['bytes'] is not None else -1)} "
                               f"({p['description']})" + (" [older than this login/job]" if p["older_than_session"]
                                                          else "") for p in row["processes"])
            lines.append(f"GPU {row['device']} processes ({format_bytes(row['free_memory'])} of "
                         f"{format_bytes(row['total_memory'])} free): {listed or 'none'}")
    if report.binding is not None and report.binding.get("device") is not None:
        b = report.binding
        lines.append(f"bind() would use: cuda:{b['device']} ({b['uuid']}), chosen by {b['chosen_by']}")
    if report.peer_access is not None:
        n = len(report.peer_access)
        lines.append("peer access (cuDeviceCanAccessPeer; row = from, column = to): "
                     + " ".join(f"{i}" for i in range(n)))
        for i, row in enumerate(report.peer_access):
            cells = " ".join("-" if c is None else ("y" if c else "n") for c in row)
            lines.append(f"peer access from GPU {i}: {cells}")
    if report.p2p is not None:
        for p in report.p2p["pairs"]:
            if p.get("error"):
                state = f"failed: {p['error']['message']}"
            elif p.get("verified"):
                state = "verified" + (" (peer path)" if p.get("peer_access_enabled") else " (staged through host)")
            else:
                state = (f"DATA LOST: {p.get('mismatched_bytes')} of {p.get('bytes')} bytes differ"
                         + (", destination untouched" if p.get("destination_unchanged") else ""))
            lines.append(f"peer copy GPU {p['src']} -> GPU {p['dst']}: {state}")
        if report.p2p.get("timed_out"):
            hung = report.p2p.get("hung_pair")
            lines.append("peer copies: deadline passed" + (f" during GPU {hung[0]} -> GPU {hung[1]}" if hung else ""))
    if report.nccl is not None:
        for key, value in report.nccl.get("summary", {}).items():
            lines.append(f"nccl {key}: {value}")
    for what, why in report.unchecked:
        lines.append(f"not checked: {what}: {why}")
    lines.append("")
    findings = sorted(report.findings, key=_severity_order)
    if not findings:
        lines.append("findings: none")
    for f in findings:
        lines.append(f"{f.severity}: {f.message}")
        if f.fix:
            lines.append(f"  fix: {f.fix}")
    return "\n".join(lines) + "\n"
