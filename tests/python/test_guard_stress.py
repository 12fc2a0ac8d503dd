"""guard() and assert_same_device under model surgery: heads swapped, layers added and deleted,
load_state_dict(assign=True), parameters replaced, modules moved between devices, hooks removed twice, the
model freed while guarded, and 100k calls without memory growth. `cpu` and `meta` are the two devices."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from torch import nn

import gpuguard

# its memory test reads this process's resident memory: in an xdist worker that ran other files first it grew 13 MB
pytestmark = pytest.mark.wall_clock

META = torch.device("meta")
CPU = torch.device("cpu")


class ViT(nn.Module):
    """A root module owning a parameter (the class token) beside its layers, as timm's and HF's ViTs do."""

    def __init__(self, width: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, width))
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.cls_token
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def mismatch(fn, *args, **kwargs) -> gpuguard.DeviceMismatchError:
    with pytest.raises(gpuguard.DeviceMismatchError) as info:
        fn(*args, **kwargs)
    return info.value


# ---- issue 15, item 1 --------------------------------------------------------------------------------------

def test_deep_guard_survives_a_head_swap_on_a_model_whose_root_owns_a_parameter():
    model = ViT()
    handle = gpuguard.guard(model, deep=True)
    x = torch.zeros(2, 4)
    assert model(x).shape == (2, 3)
    model.head = nn.Linear(4, 10)  # fine-tuning the usual way
    assert model(x).shape == (2, 10)  # was: TypeError "gpuguard's forward pre-hook takes (module, args, kwargs)"
    assert handle.hooked_layers == ["", "blocks.0", "blocks.1", "norm", "head"]
    # the new head is checked, and so is the root's own parameter
    model.head = nn.Linear(4, 10, device="meta")
    assert mismatch(model, x).layer == "head"
    model.head = nn.Linear(4, 10)
    model.cls_token = nn.Parameter(torch.zeros(1, 4, device="meta"))
    err = mismatch(model, x)
    assert err.layer == "<root>" and "cls_token" in str(err)
    handle.remove()


def test_a_hook_removed_during_the_forward_is_not_called_with_the_wrong_signature():
    model = ViT()
    handle = gpuguard.guard(model, deep=True)
    model.register_forward_pre_hook(lambda module, args: handle.remove())  # runs after gpuguard's (prepended)
    assert model(torch.zeros(2, 4)).shape == (2, 3)
    assert model(torch.zeros(2, 4)).shape == (2, 3)
    plain = gpuguard.guard(model)
    model.register_forward_pre_hook(lambda module, args: plain.remove(), prepend=True)  # before gpuguard's
    assert model(torch.zeros(2, 4)).shape == (2, 3)  # PyTorch still calls it, without kwargs: it checks


# ---- surgery ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("deep", [False, True])
def test_every_kind_of_surgery_is_seen_on_the_next_forward(deep):
    model = ViT()
    handle = gpuguard.guard(model, deep=deep)
    x = torch.zeros(2, 4)

    def agrees() -> None:
        assert gpuguard.assert_same_device(model, x) == CPU
        model(x)

    def refuses(*names: str) -> None:
        err = mismatch(model, x)
        for name in names:
            assert name in str(err), (name, str(err))
        assert gpuguard.find_device_mismatch(model, x) is not None

    agrees()
    model.head = nn.Linear(4, 7, device="meta")  # head swapped onto another device
    refuses("head")
    model.head = nn.Linear(4, 7)  # ... and back
    agrees()
    model.blocks.append(nn.Linear(4, 4, device="meta"))  # a layer added
    refuses("blocks.2")
    del model.blocks[2]  # ... and deleted
    agrees()
    model.blocks.insert(0, nn.Linear(4, 4))
    agrees()
    del model.blocks[0]
    state = {k: torch.zeros_like(v, device="meta") for k, v in model.state_dict().items()}
    model.load_state_dict({**model.state_dict(), "norm.weight": state["norm.weight"]}, assign=True)
    refuses("norm", "weight")
    if deep:
        assert mismatch(model, x).fix == 'Fix: keep the layer in one piece: model.get_submodule("norm").to("cpu").'
    model.load_state_dict({"norm.weight": torch.ones(4)}, strict=False, assign=True)
    agrees()
    model.norm.bias = nn.Parameter(torch.zeros(4, device="meta"))  # a parameter replaced
    refuses("norm", "bias")
    model.norm.bias = nn.Parameter(torch.zeros(4))
    agrees()
    model.to("meta")  # the whole model moved; the input follows
    x = torch.zeros(2, 4, device="meta")
    assert gpuguard.assert_same_device(model, x) == META
    model(x)
    refuses_cpu = mismatch(model, torch.zeros(2, 4))
    assert refuses_cpu.devices == ["meta", "cpu"]
    model.to_empty(device="cpu")  # moved back (meta tensors have no data: to_empty is the way back)
    x = torch.zeros(2, 4)
    agrees()
    handle.remove()
    handle.remove()  # twice: nothing left to remove, no error
    model.head = nn.Linear(4, 7, device="meta")
    with pytest.raises(RuntimeError):  # no gpuguard hook left: PyTorch's own error (or meta's)
        model(x)
    assert handle.hooked_layers == []
    assert "removed" in repr(handle)


@pytest.mark.parametrize("deep", [False, True])
def test_a_model_freed_while_guarded_is_collected(deep):
    model = ViT()
    handle = gpuguard.guard(model, deep=deep)
    model(torch.zeros(2, 4))
    gpuguard.assert_same_device(model, torch.zeros(2, 4))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, "gpuguard kept the model alive"
    assert handle.module is None
    handle.remove()  # the model is gone: removing is still fine
    handle.remove()


def test_a_model_freed_inside_a_reference_cycle_while_guarded_is_collected():
    model = ViT()
    model.myself = [model]  # a cycle through the model: only the garbage collector can free it
    handle = gpuguard.guard(model, deep=True)
    model(torch.zeros(2, 4))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
    del handle


# ---- 100k calls -----------------------------------------------------------------------------------------

def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
@pytest.mark.parametrize("path", ["guard", "guard_deep", "assert_same_device"])
def test_100k_calls_do_not_grow_memory(path):
    """100k checks of a tiny model (20k under deep=True, whose every forward runs Python hooks): resident
    memory and live Python objects must stay flat after a warm-up. The cheapest call path of each kind is
    used (no autograd, one small tensor) so that this stays a few seconds on a loaded machine."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    x = torch.zeros(1, 2)
    if path == "assert_same_device":
        check = gpuguard.assert_same_device

        def call() -> None:
            check(model, x)
    else:
        gpuguard.guard(model, deep=(path == "guard_deep"))

        def call() -> None:
            model(x)
    n = 20_000 if path == "guard_deep" else 100_000
    with torch.no_grad():
        for _ in range(5_000):  # warm-up: caches, allocator pools, interned strings
            call()
        gc.collect()
        objects, rss = len(gc.get_objects()), _rss_bytes()
        for _ in range(n):
            call()
        gc.collect()
        grown_objects, grown_rss = len(gc.get_objects()) - objects, _rss_bytes() - rss
    # a leak of one small object per call would be 100k objects and several MB
    assert grown_objects < 100, f"{grown_objects} Python objects more after {n} calls"
    assert grown_rss < 4 * 1024 * 1024, f"resident memory grew by {grown_rss / 1e6:.1f} MB over {n} calls"
