"""The advice of assert_same_device and guard(deep=True) is right when followed, for models on one GPU and
models placed across GPUs. FakeTensorMode gives tensors real cuda:N devices without a GPU (PyTorch checks
their devices as it would on GPUs and raises its own "Expected all tensors ..."), so each test applies the
fix the message gives and runs the model again. Every test runs against both implementations of the checks
(tensor_checks_impl: C++, and the Python one used where gpuguard._libtorch cannot load)."""

from __future__ import annotations

import functools
import re

import pytest
import torch
from torch import nn

import gpuguard

pytestmark = [pytest.mark.follows_torch, pytest.mark.usefixtures("tensor_checks_impl")]


def move_whole(model: nn.Module, device: str) -> nn.Module:
    """model.to(device) for fake tensors: .to() would swap each fake parameter in place, which the fake mode
    refuses; this replaces each one by a new parameter on `device`, as model.to() does with
    torch.__future__.set_overwrite_module_params_on_conversion(True)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to(device)
    return model


def mismatch(fn, *args, **kwargs) -> gpuguard.DeviceMismatchError:
    with pytest.raises(gpuguard.DeviceMismatchError) as info:
        fn(*args, **kwargs)
    return info.value


def torch_refuses(model, x) -> None:
    """Without gpuguard, PyTorch itself stops: the situation is real, not gpuguard's opinion."""
    with pytest.raises(RuntimeError, match="device"):
        model(x)


def device_in_fix(fix: str) -> str:
    """The device the fix moves the inputs to: `x = x.to("cuda:0")`."""
    m = re.search(r'(\w+) = \1\.to\("([\w:]+)"\)', fix)
    assert m, f"no input move in: {fix}"
    return m.group(2)


class HandSplit(nn.Module):
    """Model parallelism by hand: layer i on cuda:i, its forward hands the activation to each layer's device."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8, device=f"cuda:{i}") for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        for i in range(1, 4):
            x = self.layers[i](x.to(f"cuda:{i}"))
        return x


class Block(nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Decoder(nn.Module):
    """An embedding, four blocks and a head; `device_map` places each (a framework's placement), else all on
    `device`."""

    def __init__(self, device: str = "cuda:0", device_map: dict[str, str] | None = None) -> None:
        super().__init__()
        where = device_map or {}
        self.embed = nn.Linear(8, 8, device=where.get("embed", device))
        self.blocks = nn.ModuleList(Block(where.get(f"blocks.{i}", device)) for i in range(4))
        self.head = nn.Linear(8, 2, device=where.get("head", device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def dispatch(device_map: dict[str, str]) -> nn.Module:
    """What a framework's device map does (accelerate's dispatch_model, transformers' device_map="auto"):
    each listed submodule is placed on its device and its forward wrapped to move its inputs there first
    (as accelerate's AlignDevicesHook does), so that activations follow the layers."""
    model = Decoder(device_map=PLACEMENT)
    for name, device in device_map.items():
        sub = model.get_submodule(name)
        inner = sub.forward

        @functools.wraps(inner)
        def forward(*args, _inner=inner, _device=device, **kwargs):
            args = tuple(a.to(_device) if isinstance(a, torch.Tensor) else a for a in args)
            return _inner(*args, **kwargs)

        sub.forward = forward
    model.device_map = dict(device_map)
    return model


# Blocks only: a leaf listed in a device map (an embedding, a head) gets its forward wrapped too, and
# guard(deep=True)'s pre-hook runs before that wrapper moves the inputs (a known limit, see _DeepGuard in
# python/gpuguard/tensors/tensor_devices.py).
DEVICE_MAP = {"blocks.0": "cuda:0", "blocks.1": "cuda:1", "blocks.2": "cuda:2", "blocks.3": "cuda:3"}
PLACEMENT = {"embed": "cuda:0", **DEVICE_MAP, "head": "cuda:3"}


# ---- a model placed across GPUs, inputs moved by hand to cuda:3 ---------------------------------------------

def test_split_model_with_inputs_on_the_last_gpu_is_told_to_put_them_where_the_first_layer_is(fake):
    model = HandSplit()
    x = torch.empty(2, 8, device="cuda:3")
    torch_refuses(model, x)

    err = mismatch(gpuguard.assert_same_device, model, x)
    msg = str(err)
    assert msg.startswith("gpuguard: the model (HandSplit) is split: its parameters and buffers are on 4 devices "
                          "(cuda:0, cuda:1, cuda:2, cuda:3), so no one device holds it and its inputs.\n")
    assert "model.to(" not in err.fix
    assert 'put the inputs where its first parameter (layers.0.weight) is: x = x.to("cuda:0")' in err.fix
    assert "CUDA_VISIBLE_DEVICES=0" in err.fix

    with gpuguard.guard(model, deep=True):
        deep = mismatch(model, x)
        assert deep.layer == "layers.0"
        assert deep.cause == ("Likely cause: the model is placed across 4 devices (cuda:0, cuda:1, cuda:2, cuda:3), "
                              "its first parameter (layers.0.weight) on cuda:0, but the inputs were put on cuda:3 by "
                              "hand.")
        assert "model.to(" not in deep.fix and ".to(\"cuda:3\")" not in deep.fix
        # followed, both fixes give the same placement, and the model runs
        assert device_in_fix(deep.fix) == device_in_fix(err.fix) == "cuda:0"
        out = model(x.to(device_in_fix(deep.fix)))
    assert out.device == torch.device("cuda:3")


def test_framework_placed_model_then_moved_whole_is_told_not_to_move_it(fake):
    model = dispatch(DEVICE_MAP)
    x = torch.empty(2, 8, device="cuda:0")
    assert model(x).device == torch.device("cuda:3")  # placed by the "framework": runs
    move_whole(model, "cuda:3")  # the user's model.to("cuda:3"): the framework still sends each block's
    # inputs to the block's own device
    torch_refuses(model, x.to("cuda:3"))

    # every parameter is on cuda:3, and so are the inputs: the whole-model check cannot see the problem ...
    assert gpuguard.assert_same_device(model, x.to("cuda:3")) == torch.device("cuda:3")
    # ... the layer-by-layer check can, and does not say "move the layer to cuda:1"
    with gpuguard.guard(model, deep=True):
        err = mismatch(model, x.to("cuda:3"))
    assert err.layer == "blocks.0.proj" or err.layer == "blocks.1.proj"
    assert err.cause.startswith("Likely cause: the model moves this activation to cuda:")
    assert "all of its parameters and buffers are on cuda:3: the whole model was moved to one device" in err.cause
    assert err.fix.startswith("Fix: leave placement to the framework: do not move a model it placed")
    assert "get_submodule" not in err.fix and "model.to(\"" not in err.fix
    assert "CUDA_VISIBLE_DEVICES=0" in err.fix
    # followed: placed again by the framework, inputs where the first parameter is
    model = dispatch(DEVICE_MAP)
    with gpuguard.guard(model, deep=True):
        assert model(x.to(next(model.parameters()).device)).device == torch.device("cuda:3")


def test_framework_placed_model_with_inputs_anywhere_passes_layer_by_layer(fake):
    """A framework that moves each block's inputs: the layers inside the blocks see their own device."""
    model = dispatch(DEVICE_MAP)
    with gpuguard.guard(model, deep=True):
        assert model(torch.empty(2, 8, device="cuda:0")).device == torch.device("cuda:3")
        assert model(torch.empty(2, 8, device="cuda:0")).device == torch.device("cuda:3")


# ---- a model on one GPU --------------------------------------------------------------------------------------

def test_one_gpu_model_with_inputs_on_another_is_told_to_move_the_inputs(fake):
    model = Decoder(device="cuda:1")
    x = torch.empty(2, 8, device="cuda:0")
    torch_refuses(model, x)
    err = mismatch(gpuguard.assert_same_device, model, x)
    assert err.fix == ('Fix: move the inputs to the model\'s device: x = x.to("cuda:1"), or take the device from '
                       'the model: x.to(next(model.parameters()).device).')
    with gpuguard.guard(model, deep=True):
        deep = mismatch(model, x)
        assert deep.layer == "embed"
        assert deep.cause.startswith("Likely cause: the inputs were put on cuda:0 by the caller, but the whole model "
                                     "is on cuda:1")
        assert device_in_fix(deep.fix) == device_in_fix(err.fix) == "cuda:1"
        assert model(x.to("cuda:1")).device == torch.device("cuda:1")


def test_tensor_made_on_the_cpu_inside_forward_is_told_to_be_made_on_the_inputs_device(fake):
    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Embedding(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.pos(torch.arange(x.shape[0]))  # no device=: on the CPU

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.positions = Positions()

        def forward(self, x):
            return self.positions(self.proj(x))

    model = move_whole(Net(), "cuda:0")
    with gpuguard.guard(model, deep=True):
        err = mismatch(model, torch.empty(4, 8, device="cuda:0"))
    assert err.layer == "positions.pos"
    assert err.cause.startswith("Likely cause: this input was made inside the model's forward on the CPU")
    assert "device=input.device" in err.fix or "device=x.device" in err.fix


def test_a_stage_missing_its_hand_over_is_told_to_move_the_activation_not_the_model(fake):
    class TwoStages(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Linear(8, 8, device="cuda:0"), nn.Linear(8, 8, device="cuda:0"))
            self.b = nn.Sequential(nn.Linear(8, 8, device="cuda:1"), nn.Linear(8, 8, device="cuda:1"))

        def forward(self, x):
            return self.b(self.a(x))  # the hand-over to cuda:1 is missing

    model = TwoStages()
    x = torch.empty(2, 8, device="cuda:0")
    torch_refuses(model, x)
    with gpuguard.guard(model, deep=True):
        err = mismatch(model, x)
    assert err.layer == "b.0"
    assert err.cause == ("Likely cause: the model is split across devices and the part on cuda:1 starts at 'b.0', but "
                         "nothing moves the activation from cuda:0 to cuda:1 before it.")
    assert err.fix.startswith('Fix: move it in the parent\'s forward before calling this layer: input = '
                              'input.to("cuda:1")')
    model.forward = lambda x: model.b(model.a(x).to("cuda:1"))  # the fix, followed
    with gpuguard.guard(model, deep=True):
        assert model(x).device == torch.device("cuda:1")


def test_find_device_mismatch_returns_the_report_instead_of_raising(fake):
    model = HandSplit()
    found = gpuguard.find_device_mismatch(model, torch.empty(2, 8, device="cuda:3"))
    assert isinstance(found, gpuguard.DeviceMismatchError)
    assert str(found).startswith("gpuguard: the model (HandSplit) is split")
    assert found.devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    one = nn.Linear(8, 8, device="cuda:2")
    assert gpuguard.find_device_mismatch(one, torch.empty(2, 8, device="cuda:2")) is None


def test_explain_on_pytorchs_own_error_for_a_split_model_gives_the_same_placement(fake):
    """After the fact: PyTorch's "Expected all tensors to be on the same device" for the split model with
    inputs on cuda:3, decoded by `gpuguard explain`: inputs where the first parameter is, never one device."""
    model = HandSplit()
    with pytest.raises(RuntimeError) as info:
        model(torch.empty(2, 8, device="cuda:3"))
    [diagnosis] = gpuguard.explain(str(info.value))
    assert diagnosis.kind == "device_mismatch"
    assert set(diagnosis.devices) == {"cuda:0", "cuda:3"}
    assert "Put the inputs where the model's first parameter is (next(model.parameters()).device" in diagnosis.fix
    assert "never move a model placed across GPUs to one device" in diagnosis.fix
    assert next(model.parameters()).device == torch.device("cuda:0")  # where the other two fixes put them
    assert model(torch.empty(2, 8, device="cuda:3").to(next(model.parameters()).device)).device.index == 3
