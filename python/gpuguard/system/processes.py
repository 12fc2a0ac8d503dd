"""Who holds memory on a GPU: NVML's compute processes (gpuguard._core), each pid described as far as this pid
namespace shows it (command line, user, start time), and what a CUDA context costs when NVML cannot say.

NVML names processes by pid. Drivers that translate pids (the open kernel modules' ``_gpuConvertPid``) answer in
the caller's pid namespace and leave out processes outside it; older ones answer with the host's pids, which a
process in a container cannot look up (NVIDIA/nvidia-docker#1483: "the nvidia-driver itself does not support
pid-namespaces"). Either way a pid that /proc here does not show is reported as not visible, never guessed at.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass
from typing import Optional

from .._core import GpuProcess, GpuUsage, gpu_usage, nvml_status

#: What one CUDA context holds when NVML cannot measure it, with where the numbers come from. Since CUDA 11.7
#: loads kernels lazily: "around 400MB if CUDA >= 11.7 is used and lazy module loading enabled"
#: (pytorch/pytorch#109888, a PyTorch maintainer); 414 MiB per stray context of a 4-rank job on A100s
#: (awslabs/keys_values#92, torch's own out-of-memory message); 426 MiB for torch.cuda.mem_get_info(0) with
#: torch 2.10 and CUDA 13 (unslothai/unsloth-zoo#1053); 871 MiB each, 7 of them on rank 0's GPU, before lazy
#: loading (pytorch/pytorch#49481). tests/python/gpu/test_gpu_context_cost.py measures it on a real GPU.
TYPICAL_CONTEXT_COST = ("typically 300-500 MiB with CUDA >= 11.7 (about 400 MiB per PyTorch's maintainers, "
                        "pytorch/pytorch#109888), more than twice that with older CUDA")
#: A process holding at most this much is about a context's worth (a context and a few small tensors).
CONTEXT_SIZED_BYTES = 1536 << 20
#: Memory in use on a GPU that NVML lists under no process, above which it is worth saying (well above what the
#: driver reserves for itself, some hundreds of MiB).
UNLISTED_WORTH_SAYING_BYTES = 2 << 30


def format_bytes(n: int) -> str:
    """1.5 GiB / 414 MiB / 12 KiB, as torch and nvidia-smi print sizes."""
    if n < 0:
        return "an amount NVML cannot report"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f} MiB"
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def usage_of(uuid: str, pci_bus_id: str = "") -> tuple[Optional[GpuUsage], str]:
    """NVML's view of one GPU (or MIG instance), or None and why not (NVML missing, a GPU it does not know)."""
    status = nvml_status()
    if not status.initialized:
        return None, status.reason or "NVML could not be initialised"
    usage, error = gpu_usage(uuid, pci_bus_id)
    if usage is None:
        return None, error.message if error is not None else "NVML gave no answer"
    return usage, ""


def process_memory(usage: Optional[GpuUsage], pid: int) -> Optional[int]:
    """The bytes NVML says ``pid`` holds on that GPU; None when NVML does not list it or cannot say."""
    if usage is None:
        return None
    for p in usage.processes:
        if p.pid == pid and p.used_memory >= 0:
            return int(p.used_memory)
    return None


def unlisted_memory(usage: GpuUsage) -> int:
    """Memory in use that NVML lists under no process (processes of another pid namespace on drivers that leave
    those out, and the driver's own reserve): used, less the reserve where NVML says it, less the processes."""
    listed = sum(max(int(p.used_memory), 0) for p in usage.processes)
    reserved = max(int(usage.reserved_memory), 0)
    return max(int(usage.used_memory) - reserved - listed, 0)


# ---- one pid, as /proc shows it ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessView:
    """What this pid namespace shows of one pid: its command line, user and start time, or why nothing."""

    pid: int
    visible: bool
    command: str = ""
    user: str = ""
    started: Optional[float] = None  # seconds since the epoch
    why_not: str = ""

    def describe(self) -> str:
        """'python serve.py --port 8000, user alice, started 2024-05-01 10:00:00 (3.2 h ago)', or why not."""
        if not self.visible:
            return self.why_not
        parts = [self.command or "(no command line)"]
        if self.user:
            parts.append(f"user {self.user}")
        if self.started is not None:
            parts.append(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))} "
                         f"({_age(time.time() - self.started)} ago)")
        return ", ".join(parts)


NOT_IN_NAMESPACE = ("not visible from this pid namespace: a process of another container, or, where the driver "
                    "reports the host's pids, any process seen from inside a container")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def boot_time() -> Optional[float]:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def start_time(pid: int) -> Optional[float]:
    """When ``pid`` started (seconds since the epoch), from /proc/<pid>/stat's starttime and the boot time."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
        # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
    except (OSError, ValueError, IndexError):
        return None
    booted = boot_time()
    return None if booted is None else booted + ticks / os.sysconf("SC_CLK_TCK")


def describe_pid(pid: int) -> ProcessView:
    """What /proc shows of ``pid`` here."""
    base = f"/proc/{pid}"
    try:
        owner = os.stat(base).st_uid
    except FileNotFoundError:
        return ProcessView(pid, False, why_not=NOT_IN_NAMESPACE)
    except OSError as exc:
        return ProcessView(pid, False, why_not=f"not readable here ({exc.strerror})")
    try:
        user = pwd.getpwuid(owner).pw_name
    except KeyError:
        user = f"uid {owner}"
    command = ""
    try:
        with open(f"{base}/cmdline", "rb") as f:
            raw = f.read(4096)
        command = " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    except OSError:
        pass  # hidepid, or it just exited: the user and start time may still say enough
    if len(command) > 200:
        command = command[:199] + "…"
    return ProcessView(pid, True, command=command, user=user, started=start_time(pid))


def session_start() -> Optional[float]:
    """When the current login or job began: the start of this process's session leader (the login shell of an
    ssh session, the batch script or task of a SLURM job), else of this process."""
    try:
        leader = os.getsid(0)
    except OSError:
        leader = os.getpid()
    return start_time(leader) or start_time(os.getpid())


def ancestors(pid: int, limit: int = 64) -> set[int]:
    """``pid`` and the processes it descends from (read from /proc/<pid>/stat's ppid), bounded."""
    out = {pid}
    current = pid
    for _ in range(limit):
        try:
            with open(f"/proc/{current}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if parent <= 0 or parent in out:
            break
        out.add(parent)
        current = parent
    return out


__all__ = ["GpuProcess", "GpuUsage", "ProcessView", "TYPICAL_CONTEXT_COST", "CONTEXT_SIZED_BYTES",
           "UNLISTED_WORTH_SAYING_BYTES", "ancestors", "describe_pid", "format_bytes", "process_memory",
           "session_start", "start_time", "unlisted_memory", "usage_of"]
