"""Compiled DistributedDataParallel and FSDP2 (fully_shard) under real torchrun (2 ranks, gloo on the CPU): the guarded
model trains compiled with no graph break of gpuguard's, and a meta input stops every rank when Dynamo traces. The
zero-code GPUGUARD_GUARD=1 guards the module given to DDP the same way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from gg_testing import launch
from gg_testing.env import auto_env, no_driver_env
from gg_testing.launch import write
from gg_testing.ports import free_port

pytestmark = pytest.mark.slow

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
# gpuguard's own source, as a graph break's reason would name it (its file, or its module); not any path with the
# word in it (CI's venvs live under ~/.cache/gpuguard-ci, which torch's own frames then carry)
OURS = (str(Path(__file__).resolve().parents[2] / "python" / "gpuguard") + "/", "site-packages/gpuguard/", "gpuguard.")


def ours(reason: str) -> bool:
    return any(mark in reason for mark in OURS)

# Each rank trains three steps compiled, then calls the model with a meta input; it writes what it saw.
COMMON = """
import json, os, sys, torch, torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
graphs = []

def backend(gm, example_inputs):
    graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
    return gm.forward

def train(step_model, params, x):
    opt = torch.optim.SGD(params, lr=0.1)
    losses = []
    for _ in range(3):
        loss = step_model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses

def meta_call(step_model, x):
    try:
        step_model(x.to("meta"))
        return {"type": None}
    except Exception as exc:
        return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "layer": getattr(exc, "layer", None), "message": str(exc)}

def finish(out):
    out["graphs"] = graphs
    out["breaks"] = list(torch._dynamo.utils.counters["graph_break"])
    out["hooks"] = sorted({h.__module__ + "." + getattr(h, "__qualname__", type(h).__qualname__)
                           for m in MODEL.modules() for h in m._forward_pre_hooks.values()})
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
"""

DDP_SCRIPT = COMMON + """
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
if sys.argv[2] == "explicit":
    import gpuguard
    gpuguard.guard(MODEL, deep=True)
if sys.argv[3] == "compile(DDP(model))":
    ddp = DDP(MODEL)
    step_model = torch.compile(ddp, backend=backend)
else:  # DDP(compile(model))
    ddp = DDP(torch.compile(MODEL, backend=backend))
    step_model = ddp
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
out = {"losses": train(step_model, ddp.parameters(), x), "meta": meta_call(step_model, x)}
finish(out)
"""

FSDP2_SCRIPT = COMMON + """
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.4, 2.5
    from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
import gpuguard

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

torch.manual_seed(0)
MODEL = Net()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
gpuguard.guard(MODEL, deep=True)
if sys.argv[2] == "blocks":  # torchtitan's way: each block compiled whole, then sharded
    for i, block in enumerate(MODEL.layers):
        MODEL.layers[i] = torch.compile(block, backend=backend, fullgraph=True)
        fully_shard(MODEL.layers[i], mesh=mesh)
    fully_shard(MODEL, mesh=mesh)
    step_model = MODEL
else:  # the whole sharded model compiled: torch itself breaks the graph at FSDP's hooks
    for block in MODEL.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(MODEL, mesh=mesh)
    step_model = torch.compile(MODEL, backend=backend)
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
out = {"losses": train(step_model, MODEL.parameters(), x), "meta": meta_call(step_model, x)}
finish(out)
"""


def torchrun(script: Path, tmp_path: Path, env: dict[str, str], *args: str) -> dict[int, dict]:
    # the script writes rank<N>.json into the folder its first argument names: the job's result folder
    proc = launch.torchrun(str(script), str(tmp_path / "results"), *args, nproc=2, port=free_port(), env=env,
                           workdir=tmp_path, timeout=280)
    assert proc.returncode == 0 and sorted(proc.ranks) == [0, 1], proc.stderr[-4000:]
    return proc.ranks


def assert_compiled_and_stopped_at_trace_time(got: dict, first_layer: str) -> None:
    assert got["graphs"] and all("linear" in " ".join(g) for g in got["graphs"]), got["graphs"]
    assert not any("gpuguard" in target for g in got["graphs"] for target in g)
    assert not any(ours(reason) for reason in got["breaks"]), got["breaks"]
    assert all(loss == loss for loss in got["losses"]) and got["losses"][-1] < got["losses"][0]
    meta = got["meta"]
    assert meta["type"] == "CompileTimeDeviceMismatchError", meta
    assert "DeviceMismatchError" in meta["mro"] and "TorchRuntimeError" in meta["mro"]
    assert meta["layer"] == first_layer
    assert meta["message"].startswith(f"gpuguard: layer '{first_layer}' (Linear) is about to run on tensors from "
                                      f"2 devices (cpu, meta)")
    assert "the inputs were put on meta by the caller" in meta["message"]


@pytest.mark.parametrize("pattern", ["compile(DDP(model))", "DDP(compile(model))"])
@pytest.mark.parametrize("how", ["explicit", "zero-code"])
def test_compiled_ddp_of_a_guarded_model_trains_and_stops_every_rank_at_trace_time(tmp_path, how, pattern):
    if pattern == "compile(DDP(model))" and TORCH < (2, 15):
        pytest.skip("torch 2.6 compiles nothing of torch.compile(DDP(model)) on the CPU with gloo, guarded or not")
    script = write(tmp_path, "train.py", DDP_SCRIPT)
    env = no_driver_env()
    if how == "zero-code":
        env = auto_env(env, GPUGUARD_GUARD="1")
    ranks = torchrun(script, tmp_path, env, how, pattern)
    for got in ranks.values():
        assert_compiled_and_stopped_at_trace_time(got, "0")
        assert got["hooks"] == ["gpuguard.tensors.tensor_devices._DeepGuard", "gpuguard.tensors.tensor_devices.gpuguard_layer_check"]
    # DDP kept the ranks' parameters equal, so equal losses after the first step on the same data are not asked;
    # that both ranks trained is (each rank its own data)
    assert ranks[0]["losses"] != ranks[1]["losses"]


# torch 2.6's FSDP2 stops on the CPU by itself: "'Stream' object has no attribute 'record_event'" (2.15 runs it)
FSDP2_ON_THE_CPU = pytest.mark.skipif(TORCH < (2, 15), reason="torch 2.6's FSDP2 cannot run on the CPU (gloo)")


@FSDP2_ON_THE_CPU
def test_fsdp2_blocks_compiled_with_fullgraph_train_guarded_and_stop_every_rank_at_trace_time(tmp_path):
    script = write(tmp_path, "train.py", FSDP2_SCRIPT)
    ranks = torchrun(script, tmp_path, no_driver_env(), "blocks")
    for got in ranks.values():
        assert got["breaks"] == []  # fullgraph=True: none at all
        assert_compiled_and_stopped_at_trace_time(got, "layers.0._orig_mod.fc")


@FSDP2_ON_THE_CPU
def test_fsdp2_model_compiled_whole_breaks_only_at_torchs_own_fsdp_hooks(tmp_path):
    script = write(tmp_path, "train.py", FSDP2_SCRIPT)
    ranks = torchrun(script, tmp_path, no_driver_env(), "whole")
    for got in ranks.values():
        assert not any(ours(reason) for reason in got["breaks"]), got["breaks"]
        assert got["meta"]["type"] in ("CompileTimeDeviceMismatchError", "DeviceMismatchError"), got["meta"]
        assert got["meta"]["layer"] == "layers.0.fc"
