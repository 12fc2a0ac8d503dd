"""A real N-node SLURM cluster on this one machine, for the real-launcher tests (run as root).

Each node is a set of fresh network, UTS (hostname) and mount namespaces held open by one ``sleep`` process:
its own hostname (``gg1``, ``gg2``, ...), its own ``/etc/hosts`` (bind-mounted inside the node only), and one
address on a private subnet (``10.213.47.0/24``) that exists only inside the namespaces: node 1 holds a
bridge, every other node a veth link to it. Nothing is configured in the machine's own network namespace; its
loopback is not used either. munged (its own key and socket under the cluster's folder) authenticates;
slurmctld runs on node 1, one slurmd per node. Every node sees its own fake GPU topology with distinct UUIDs:
``GPUGUARD_FAKE_TOPOLOGY=<dir>/topology/%h.json`` (the fake driver replaces ``%h`` with the hostname).

    python3 tests/cluster/cluster.py selftest 3   # up, srun hostname on every node, down, with timings

Teardown kills every process it started (daemons by their pid; the namespaces vanish with their holder) and
removes the folder; ``Cluster`` is a context manager so a failed bring-up is torn down too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

if __name__ == "__main__":  # run as a script (selftest): tests/ on the path, for gg_testing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gg_testing.procs import kill_group  # noqa: E402

SUBNET = "10.213.47"
PREFIX = "gg"


def missing_requirements() -> Optional[str]:
    """None when this machine can run the cluster; else the reason, for pytest's skip message."""
    if sys.platform != "linux":
        return "the test cluster needs Linux namespaces"
    if os.geteuid() != 0:
        return "the test cluster needs root (network/UTS/mount namespaces, slurmd)"
    tools = ["slurmctld", "slurmd", "srun", "sbatch", "munged", "unshare", "nsenter", "ip"]
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        return f"the test cluster needs {', '.join(absent)} (Debian: slurm-wlm munge iproute2; scripts/setup.sh)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.strip()}"
    return None


def topology(node: int, gpus: int) -> dict:
    """A fake H100 node whose UUIDs differ from every other node's (node number in the UUID)."""
    return {"driver_version": 13000, "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{node:08x}-0000-4000-8000-{i:012x}",
         "pci_bus_id": f"0000:{0x18 + i:02x}:00.0", "memory_mib": 81559, "compute_capability": [9, 0]}
        for i in range(gpus)]}


class Cluster:
    """``nodes`` SLURM nodes with ``cpus`` CPUs and ``gpus`` fake GPUs each. Use as a context manager."""

    def __init__(self, nodes: int = 3, cpus: int = 8, gpus: int = 4, fakes_dir: Optional[Path] = None,
                 python_path: Optional[str] = None) -> None:
        self.nodes, self.cpus, self.gpus = nodes, cpus, gpus
        self.dir = Path(tempfile.mkdtemp(prefix="ggc-", dir="/tmp"))  # short: unix socket paths are bounded
        self.names = [f"{PREFIX}{i}" for i in range(1, nodes + 1)]
        self.holders: list[subprocess.Popen] = []
        self.daemons: list[subprocess.Popen] = []
        self.munged_pid: Optional[int] = None
        self.fakes_dir, self.python_path = fakes_dir, python_path
        self.timings: dict[str, float] = {}

    # ---- bring-up -------------------------------------------------------------------------------------------

    def __enter__(self) -> "Cluster":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node}"

    def up(self) -> None:
        started = time.monotonic()
        self._files()
        self._munge()
        self._namespaces()
        self.timings["namespaces_s"] = time.monotonic() - started
        self._daemons()
        self.wait_ready()
        self.timings["up_s"] = time.monotonic() - started

    def _files(self) -> None:
        d = self.dir
        for sub in ("topology", "state", "log", "munge", "nodetmp"):
            (d / sub).mkdir()
        for i, name in enumerate(self.names, 1):
            (d / "topology" / f"{name}.json").write_text(json.dumps(topology(i, self.gpus)))
            (d / name).mkdir()
            (d / name / "tmp").mkdir()
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(i)} {n}\n" for i, n in enumerate(self.names, 1))
        (d / "hosts").write_text(hosts)
        (d / "plugstack.conf").write_text("")
        conf = f"""ClusterName=gpuguard
SlurmctldHost={self.names[0]}({self.address(1)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/sock
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/%n/spool
SlurmdPidFile={d}/%n/slurmd.pid
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
PlugStackConfig={d}/plugstack.conf
TmpFS={d}/nodetmp
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
MessageTimeout=20
"""
        for i, name in enumerate(self.names, 1):
            conf += f"NodeName={name} NodeAddr={self.address(i)} CPUs={self.cpus} State=UNKNOWN\n"
        conf += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n"
        (d / "slurm.conf").write_text(conf)

    def _munge(self) -> None:
        m = self.dir / "munge"
        key = m / "key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m.chmod(0o700)
        subprocess.run(["munged", f"--socket={m}/sock", f"--key-file={key}", f"--pid-file={m}/pid",
                        f"--log-file={m}/log", f"--seed-file={m}/seed", "--force"], check=True,
                       capture_output=True, text=True, timeout=30)
        self.munged_pid = int((m / "pid").read_text())

    def _namespaces(self) -> None:
        for name in self.names:
            # TmpFS (where SLURM's PMIx plugin makes its per-step folders) is per node, as on a real cluster
            script = (f"mount --make-rprivate / && mount --bind {self.dir}/hosts /etc/hosts && "
                      f"mount --bind {self.dir}/{name}/tmp {self.dir}/nodetmp && "
                      f"hostname {name} && exec sleep infinity")
            holder = subprocess.Popen(["unshare", "--net", "--uts", "--mount", "sh", "-c", script],
                                      start_new_session=True)
            self.holders.append(holder)
        for holder, name in zip(self.holders, self.names):  # wait until each holder reached its sleep
            deadline = time.monotonic() + 20
            while self._hostname(holder.pid) != name:
                if holder.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node {name}: the namespace holder did not start (rc {holder.poll()})")
                time.sleep(0.05)
        hub = self.holders[0].pid
        self.ns(1, "ip link set lo up && ip link add br0 type bridge && "
                   f"ip addr add {self.address(1)}/24 dev br0 && ip link set br0 up")
        for i in range(2, self.nodes + 1):
            pid = self.holders[i - 1].pid
            self.ns(1, f"ip link add v{i} type veth peer name eth0 netns {pid} && ip link set v{i} master br0 && "
                       f"ip link set v{i} up")
            self.ns(i, f"ip link set lo up && ip addr add {self.address(i)}/24 dev eth0 && ip link set eth0 up")
        del hub

    @staticmethod
    def _hostname(pid: int) -> Optional[str]:
        r = subprocess.run(["nsenter", "-t", str(pid), "-u", "hostname"], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    def enter(self, node: int) -> list[str]:
        """The command prefix that runs something inside ``node`` (1-based)."""
        return ["nsenter", "-t", str(self.holders[node - 1].pid), "-n", "-u", "-m"]

    def ns(self, node: int, script: str) -> str:
        r = subprocess.run(self.enter(node) + ["sh", "-c", script], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"on {self.names[node - 1]}: {script}: {r.stderr.strip()}")
        return r.stdout

    def _daemons(self) -> None:
        conf = str(self.dir / "slurm.conf")
        env = self.env()
        self.daemons.append(subprocess.Popen(self.enter(1) + ["slurmctld", "-D", "-i", "-f", conf],
                                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(1, self.nodes + 1):
            self.daemons.append(subprocess.Popen(self.enter(i) + ["slurmd", "-D", "-f", conf],
                                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for d in self.daemons:
                if d.poll() is not None:
                    raise RuntimeError(f"a SLURM daemon exited (rc {d.returncode}); logs in {self.dir}/log\n"
                                       + self.logs())
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], node=1, timeout=20, check=False)
            last = r.stdout + r.stderr
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if len(states) == self.nodes and all(s in ("idle", "mix", "alloc") for s in states.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes did not become idle within {timeout} s: {last}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.dir / "log").glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    # ---- use ------------------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a job submitted to this cluster: SLURM_CONF, the fake GPUs, this gpuguard."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC"))}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "CUDA_VISIBLE_DEVICES", "GPUGUARD_LAUNCHER", "GPUGUARD_GROUP"):
            env.pop(k, None)
        env["SLURM_CONF"] = str(self.dir / "slurm.conf")
        env["GPUGUARD_FAKE_TOPOLOGY"] = f"{self.dir}/topology/%h.json"
        if self.fakes_dir is not None:
            env["GPUGUARD_LIBCUDA"] = str(self.fakes_dir / "libgpuguard_fake_cuda.so")
            env["GPUGUARD_LIBNCCL"] = str(self.fakes_dir / "libgpuguard_fake_nccl.so")
            env["GPUGUARD_FAKE_NCCL_DIR"] = str(self.dir / "nccl")
        if self.python_path:
            env["PYTHONPATH"] = self.python_path
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        env["OMPI_MCA_btl"] = "self,tcp"
        env.update(extra)
        return env

    def run(self, argv: Sequence[str], *, node: int = 1, timeout: float = 120, check: bool = True,
            env: Optional[dict[str, str]] = None, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        """Runs ``argv`` on ``node`` (1-based) in the cluster's environment; the whole process group is killed
        when ``timeout`` passes. What the ranks write into ``$GG_RESULTS`` (a fresh folder per call) is
        appended to the returned stdout."""
        env = dict(env or self.env())
        results = Path(tempfile.mkdtemp(prefix="results-", dir=self.dir))
        env["GG_RESULTS"] = str(results)
        proc = subprocess.Popen(self.enter(node) + list(argv), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=cwd or str(self.dir))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            raise RuntimeError(f"{' '.join(argv)} ran past {timeout} s on {self.names[node - 1]}:\n{out}\n{err}")
        out += "".join(f.read_text() for f in sorted(results.glob("*.json")))
        r = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{out}\n{err}")
        return r

    def sbatch(self, script: str, *, args: Sequence[str] = (), timeout: float = 180,
               env: Optional[dict[str, str]] = None) -> str:
        """Submits ``script`` (a bash script body) with ``--wait`` and returns the job's output file."""
        path = self.dir / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/bash\n" + script)
        out = path.with_suffix(".out")
        r = self.run(["sbatch", "--wait", "-o", str(out), *args, str(path)], timeout=timeout, check=False, env=env)
        return (out.read_text() if out.exists() else "") + r.stdout

    # ---- teardown -------------------------------------------------------------------------------------------

    def down(self) -> None:
        # jobs still running: their tasks are children of slurmstepd, killed with the daemons' sessions below
        for d in self.daemons:
            if d.poll() is None:
                d.terminate()
        for d in self.daemons:
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        self._kill_node_processes()
        for h in self.holders:
            if h.poll() is None:
                h.kill()
                h.wait()
        if self.munged_pid is not None:
            try:
                os.kill(self.munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.munged_pid = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_node_processes(self) -> None:
        """Whatever still runs inside a node's namespaces (slurmstepd, tasks): found by their UTS namespace."""
        namespaces = set()
        for h in self.holders:
            try:
                namespaces.add(os.readlink(f"/proc/{h.pid}/ns/uts"))
            except OSError:
                pass
        if not namespaces:
            return
        holder_pids = {h.pid for h in self.holders}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in holder_pids:
                continue
            try:
                if os.readlink(entry / "ns" / "uts") in namespaces:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def _main(argv: list[str]) -> int:
    reason = missing_requirements()
    if reason:
        print(f"cluster: {reason}", file=sys.stderr)
        return 2
    nodes = int(argv[1]) if len(argv) > 1 else 3
    if argv[0] == "selftest":
        with Cluster(nodes) as c:
            r = c.run(["srun", "-N", str(nodes), "-n", str(nodes), "hostname"], timeout=60)
            print(f"cluster: {nodes} nodes up in {c.timings['up_s']:.1f} s "
                  f"(namespaces {c.timings['namespaces_s']:.1f} s); srun hostname -> {sorted(r.stdout.split())}")
        return 0
    print(f"usage: {argv[0] if argv else 'cluster.py'} selftest [N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
