"""assert_same_device, @same_device and guard(): the check, the report's wording, and that the answer is
never stale after the model changes. `cpu` and `meta` are two real, different devices without a GPU. Every test
runs against both implementations of the checks (tensor_checks_impl: C++, and the Python one used where
gpuguard._libtorch cannot load)."""

from __future__ import annotations

import collections
import dataclasses
import gc
import re
import textwrap
import warnings
import weakref

import pytest
import torch
from torch import nn

import gpuguard
from gg_testing.env import no_driver_env
from gg_testing.procs import USE_PYTHON_CHECKS, run_json

CPU = torch.device("cpu")
META = torch.device("meta")

pytestmark = [pytest.mark.follows_torch, pytest.mark.usefixtures("tensor_checks_impl")]


class Stack(nn.Module):
    """layers.0 … layers.{n-1} (Linear, weight + bias) and a LayerNorm: 2n + 2 parameters."""

    def __init__(self, n: int = 16, width: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n))
        self.norm = nn.LayerNorm(width)
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) * self.scale


class Split(nn.Module):
    """A model split across two devices on purpose: the activation is moved between the halves."""

    def __init__(self, misplace_third: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.misplace_third = misplace_third
        if misplace_third:
            self.layers[2].to("meta")  # only the third layer is on the other device: a placement bug
        else:
            self.layers[2:].to("meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[1](self.layers[0](x))
        if not self.misplace_third:
            x = x.to("meta")  # the deliberate hand-over to the second device
        return self.layers[3](self.layers[2](x))


def in_python_if(implementation: str, script: str) -> str:
    """``script`` for a fresh interpreter, whose tensor checks run in ``implementation``."""
    return (USE_PYTHON_CHECKS if implementation == "Python" else "") + textwrap.dedent(script)


def mismatch(fn, *args, **kwargs) -> gpuguard.DeviceMismatchError:
    with pytest.raises(gpuguard.DeviceMismatchError) as info:
        fn(*args, **kwargs)
    return info.value


@pytest.fixture
def future_flags():
    """Restores torch.__future__'s conversion flags, whatever a test set them to."""
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    torch.__future__.set_swap_module_params_on_conversion(swap)


# ---- assert_same_device -----------------------------------------------------------------------------------

def test_returns_the_common_device_of_model_and_nested_inputs():
    Point = collections.namedtuple("Point", "a b")

    @dataclasses.dataclass
    class Batch:
        ids: torch.Tensor
        meta: dict
        note: str = "x"

    model = Stack(4)
    x = torch.zeros(2, 4)
    cyclic: list = [x]
    cyclic.append(cyclic)  # a reference cycle must not loop
    inputs = [x, (x, None), {"k": [x, 3]}, Point(x, "s"), Batch(x, {"m": x}), cyclic, None, 7]
    assert gpuguard.assert_same_device(model, *inputs) == CPU
    assert gpuguard.assert_same_device(x.to("meta"), [x.to("meta")]) == META
    assert gpuguard.assert_same_device(nn.ReLU()) is None  # no tensor at all
    assert gpuguard.assert_same_device(model, expected="cpu") == CPU
    assert gpuguard.assert_same_device(model, x, expected=torch.device("cpu")) == CPU


def test_mismatch_groups_by_device_compresses_names_and_ends_with_the_fix():
    model = Stack(16).to("meta")
    x = torch.zeros(8, 4)
    err = mismatch(gpuguard.assert_same_device, model, x)
    msg = str(err)
    lines = msg.splitlines()
    assert lines[0] == "gpuguard: tensors that must share one device are on 2 devices: meta, cpu."
    assert lines[1] == "  meta: 34 parameters, 1 buffer of Stack: layers.*, norm.*, scale"
    assert lines[2] == "  cpu: 1 input: tensors[0] (shape [8, 4], float32)"
    assert lines[-1] == ('Fix: move the inputs to the model\'s device: x = x.to("meta"), or take the device from '
                         'the model: x.to(next(model.parameters()).device).')
    assert err.fix == lines[-1] and err.cause == lines[-2] and err.without_fix() == "\n".join(lines[:-1])
    assert err.devices == ["meta", "cpu"]
    assert err.expected is None and err.layer is None
    meta, cpu = err.groups
    assert meta["device"] == "meta" and len(meta["parameters"]) == 34 and meta["buffers"] == ["scale"]
    assert meta["parameters"][:3] == ["layers.0.weight", "layers.0.bias", "layers.1.weight"]
    assert cpu["inputs"] == [{"name": "tensors[0]", "shape": [8, 4], "dtype": "float32"}]
    assert isinstance(err, gpuguard.GpuGuardError) and isinstance(err, RuntimeError)


def test_part_of_the_model_moved_is_named_as_a_range_and_the_model_is_said_to_be_split():
    model = Stack(20)
    for layer in model.layers[4:16]:
        layer.to("meta")
    err = mismatch(gpuguard.assert_same_device, model)
    msg = str(err)
    assert msg.startswith("gpuguard: the model (Stack) is split: its parameters and buffers are on 2 devices "
                          "(meta, cpu), so no one device holds it and its inputs.\n")
    assert "  cpu: 18 parameters, 1 buffer of Stack: layers.0-3.*, layers.16-19.*, norm.*, scale\n" in msg
    assert "  meta: 24 parameters of Stack: layers.4-15.*\n" in msg
    assert "Likely cause: the model is placed across devices on purpose" in msg
    # never "move everything to one device": inputs go where the first parameter is, or one GPU is made visible
    assert 'model.to(' not in err.fix
    assert err.fix.startswith('Fix: if the split is deliberate, leave placement to the framework: put the inputs '
                              'where its first parameter (layers.0.weight) is: x = x.to("cpu") '
                              '(next(model.parameters()).device); never move the whole model to one device')
    assert "CUDA_VISIBLE_DEVICES=0" in err.fix
    # a mistake is undone part by part: here the stray parts are many, so the list above is pointed at
    assert err.fix.endswith('If the split is a mistake, move the stray part to the rest: each part listed above on '
                            'another device to meta (a submodule with model.get_submodule(name).to("meta")).')


def test_only_weights_moved_are_named_with_their_suffix():
    model = Stack(8)
    for layer in model.layers:
        layer.weight = nn.Parameter(layer.weight.to("meta"))
    err = mismatch(gpuguard.assert_same_device, model)
    assert err.groups[1]["summary"] == ["layers.0-7.weight"]
    assert err.groups[0]["summary"] == ["layers.0-7.bias", "norm.*", "scale"]


def test_expected_device_names_what_is_elsewhere():
    model = Stack(2)
    err = mismatch(gpuguard.assert_same_device, model, torch.zeros(2, 4), expected="meta")
    msg = str(err)
    assert msg.startswith("gpuguard: expected every tensor on meta, but 8 tensors are elsewhere (cpu).\n")
    assert msg.endswith('Fix: move them to meta: model.to("meta"); x = x.to("meta").')
    assert err.expected == "meta"
    with pytest.raises(ValueError, match=r"expected='nowhere:0' is not a device"):
        gpuguard.assert_same_device(model, expected="nowhere:0")
    with pytest.raises(TypeError, match="expected= must be a torch.device"):
        gpuguard.assert_same_device(model, expected=1.5)


def test_inputs_alone_are_named_by_position_and_key():
    a, b = torch.zeros(3), torch.zeros(2, 5, device="meta")
    err = mismatch(gpuguard.assert_same_device, a, {"mask": [b]})
    assert "  meta: 1 input: tensors[0]['mask'][0] (shape [2, 5], float32)" in str(err)
    assert "  cpu: 1 input: model_or_tensor (shape [3], float32)" in str(err)


def test_a_cpu_scalar_agrees_with_any_device_as_in_pytorch():
    t = torch.zeros(3, device="meta")
    assert gpuguard.assert_same_device(t, torch.tensor(2.0)) == META
    assert gpuguard.assert_same_device(torch.tensor(2.0)) == CPU
    assert gpuguard.assert_same_device(t, torch.tensor(2.0), expected="meta") == META
    # a 1-element tensor is not a scalar
    mismatch(gpuguard.assert_same_device, t, torch.tensor([2.0]))


def test_a_cpu_scalar_first_in_the_model_does_not_place_the_rest():
    """Every parameter is on the CPU, the first one a scalar: the model is on the CPU all the same (its weights
    are not scalars), so an input on meta disagrees with it."""
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.temperature = nn.Parameter(torch.tensor(1.0))
            self.body = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x) / self.temperature

    model = Scaled()
    assert next(model.parameters()) is model.temperature
    assert gpuguard.assert_same_device(model, torch.zeros(2, 4)) == CPU
    err = mismatch(gpuguard.assert_same_device, model, torch.zeros(2, 4, device="meta"))
    assert err.groups[0]["parameters"] == ["body.weight", "body.bias"]  # a scalar sits with any device
    assert err.groups[1]["device"] == "meta"
    with gpuguard.guard(model):
        mismatch(model, torch.zeros(2, 4, device="meta"))


class ElsewhereTensor(torch.Tensor):
    """A tensor subclass with a device of its own making: created on the CPU, it tells PyTorch that it is on meta
    (dispatch_device=True makes tensor.device ask __torch_dispatch__)."""

    @staticmethod
    def __new__(cls, shape: tuple[int, ...]) -> "ElsewhereTensor":
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device="cpu",
                                                   dispatch_device=True)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default:
            return META
        raise NotImplementedError(f"ElsewhereTensor does not run {func}")


def test_this_torch_keeps_a_tensors_device_where_guards_scan_reads_it(tensor_checks_impl):
    """guard()'s per-forward cost rests on reading every parameter's device straight from its TensorImpl, where a
    probe at import found torch keeping it (collect_tensors.cc). A torch that moved it still gets right answers from
    device() on each tensor, several times slower: this says so, on each corner of the supported range."""
    if tensor_checks_impl == "Python":
        pytest.skip("the Python implementation calls tensor.device")
    from gpuguard import _libtorch_loader

    assert _libtorch_loader.libtorch()._reads_devices_in_one_scan()


def test_a_tensor_with_a_device_of_its_own_making_is_checked_where_it_says_it_is():
    model = nn.Linear(4, 4)
    model.register_buffer("elsewhere", ElsewhereTensor((3,)))
    assert model.elsewhere.device == META
    x = torch.zeros(2, 4)
    err = mismatch(gpuguard.assert_same_device, model, x)
    assert "  meta: 1 buffer of Linear: elsewhere" in str(err)
    with gpuguard.guard(model):
        assert mismatch(model, x).devices == ["cpu", "meta"]


class PlacedTensor(torch.Tensor):
    """A tensor whose TensorImpl says it is on a given device, with no memory there: it stands for a tensor on a GPU
    that this machine does not have, without initialising CUDA. Nothing can compute on it."""

    @staticmethod
    def __new__(cls, device: str) -> "PlacedTensor":
        return torch.Tensor._make_wrapper_subclass(cls, (4,), dtype=torch.float32, device=device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"PlacedTensor does not run {func}")


def test_two_gpus_of_one_kind_are_told_apart_by_their_index():
    """Weights on cuda:0 with one buffer, or the input, on cuda:1: the devices differ in their index alone, where
    cpu and meta differ in their type. The scan that guard() runs on every forward must read the index too."""
    class Holder(nn.Module):
        def __init__(self, devices: list[str]) -> None:
            super().__init__()
            for i, device in enumerate(devices):
                self.register_buffer(f"b{i}", PlacedTensor(device))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    x0 = PlacedTensor("cuda:0")
    whole = Holder(["cuda:0"] * 40)
    assert gpuguard.assert_same_device(whole, x0) == torch.device("cuda", 0)
    err = mismatch(gpuguard.assert_same_device, whole, PlacedTensor("cuda:1"))
    assert err.devices == ["cuda:0", "cuda:1"]
    split = Holder(["cuda:0"] * 39 + ["cuda:1"])
    err = mismatch(gpuguard.assert_same_device, split, x0)
    assert "parameters and buffers are on 2 devices (cuda:0, cuda:1)" in str(err)
    assert "  cuda:1: 1 buffer of Holder: b39" in str(err)
    with gpuguard.guard(whole):
        assert whole(x0) is x0
        assert mismatch(whole, PlacedTensor("cuda:1")).devices == ["cuda:0", "cuda:1"]
    with gpuguard.guard(split):
        assert mismatch(split, x0).devices == ["cuda:0", "cuda:1"]
    assert not torch.cuda.is_initialized()


def test_meta_sparse_subclasses_and_lazy_parameters_do_not_crash():
    class Tagged(torch.Tensor):
        pass

    sparse = torch.eye(3).to_sparse()
    with warnings.catch_warnings():  # torch: "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        csr = torch.eye(3).to_sparse_csr()
    tagged = torch.zeros(3).as_subclass(Tagged)
    assert gpuguard.assert_same_device(sparse, csr, tagged, torch.zeros(3)) == CPU
    err = mismatch(gpuguard.assert_same_device, sparse, tagged.to("meta"))
    assert "tensors[0] (shape [3], float32)" in str(err)

    lazy = nn.LazyLinear(4)  # UninitializedParameter until the first forward
    assert gpuguard.assert_same_device(lazy, torch.zeros(2, 3)) == CPU
    lazy(torch.zeros(2, 3))
    assert gpuguard.assert_same_device(lazy) == CPU
    assert gpuguard.assert_same_device(Stack(2).to("meta"), torch.empty(2, 4, device="meta")) == META


def test_tied_weights_are_named_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    err = mismatch(gpuguard.assert_same_device, model, torch.zeros(2, dtype=torch.long, device="meta"))
    assert err.groups[0]["parameters"] == ["0.weight"]  # as named_parameters() names it


# ---- never stale ------------------------------------------------------------------------------------------

def changes():
    """Each changes where part of a 4-layer Stack lives, the way users and libraries do."""

    def to(model):
        model.to("meta")

    def reassign(model):
        model.layers[1].weight = nn.Parameter(torch.zeros(4, 4, device="meta"))

    def add_submodule(model):
        model.extra = nn.Linear(4, 4, device="meta")

    def submodule_in_a_leaf(model):  # the leaf's _modules dict was empty: only registration says so
        model.layers[3].adapter = nn.Linear(4, 4, device="meta")

    def register_buffer(model):
        model.layers[0].register_buffer("table", torch.zeros(2, device="meta"))

    def load_assign(model):
        state = {k: v.to("meta") for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=True)

    def overwrite(model):
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        model.to("meta")

    def swap(model):
        torch.__future__.set_swap_module_params_on_conversion(True)
        model.to("meta")

    def direct_dict_write(model):  # what accelerate's set_module_tensor_to_device does
        model.layers[2]._parameters["bias"] = nn.Parameter(torch.zeros(4, device="meta"))

    def parameters_dict_replaced(model):  # the whole dict, not an entry
        model.norm._parameters = {"weight": nn.Parameter(torch.ones(4, device="meta")), "bias": None}

    def buffer_write(model):
        model._buffers["scale"] = torch.ones(4, device="meta")

    return [to, reassign, add_submodule, submodule_in_a_leaf, register_buffer, load_assign, overwrite, swap, direct_dict_write,
            parameters_dict_replaced, buffer_write]


@pytest.mark.parametrize("change", changes(), ids=lambda f: f.__name__)
def test_never_stale_after(change, future_flags):
    model = Stack(4)
    x = torch.zeros(2, 4)
    handle = gpuguard.guard(model)
    model(x)  # the guard has seen the model as it was
    assert gpuguard.assert_same_device(model, x) == CPU
    change(model)
    err = mismatch(model, x)
    assert "meta" in err.devices and "cpu" in err.devices
    mismatch(gpuguard.assert_same_device, model, x)
    handle.remove()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="param.data = t needs two devices whose tensors are "
                    "shallow-copy compatible (cpu and cuda); cpu and meta are not")
def test_never_stale_after_param_data_assignment():
    model = Stack(3)
    x = torch.zeros(2, 4)
    handle = gpuguard.guard(model)
    model(x)
    model.layers[1].weight.data = model.layers[1].weight.data.to("cuda")  # same object, same TensorImpl
    err = mismatch(model, x)
    assert err.groups[1]["device"] == "cuda:0" and err.groups[1]["summary"] == ["layers.1.weight"]
    mismatch(gpuguard.assert_same_device, model, x)
    model.to("cuda")  # the default conversion: param.data = param.cuda() on every parameter
    model(x.to("cuda"))
    assert gpuguard.assert_same_device(model, x.to("cuda")) == torch.device("cuda:0")
    handle.remove()


def test_guard_follows_a_model_moved_back_and_forth(future_flags):
    model = Stack(3)
    x = torch.zeros(2, 4)
    with gpuguard.guard(model):
        model(x)
        model.to("meta")
        model(x.to("meta"))
        torch.__future__.set_swap_module_params_on_conversion(True)
        model.to_empty(device="cpu")  # meta tensors hold no data to copy back
        model(x)
        del model.layers[2]
        model(x)
        model.layers[0].weight = nn.Parameter(model.layers[0].weight.to("meta"))
        err = mismatch(model, x)
        assert err.groups[1]["summary"] == ["layers.0.weight"]


def test_checks_keep_no_model_or_tensor_alive():
    class Child(nn.Module):
        def __init__(self, parent: nn.Module) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.__dict__["parent"] = parent  # a back-reference: the model is a reference cycle

    model = Stack(2)
    model.child = Child(model)
    x = torch.zeros(2, 4)
    handle = gpuguard.guard(model, deep=False)
    deep = gpuguard.guard(model, deep=True)
    model(x)
    gpuguard.assert_same_device(model, x)
    removed = weakref.ref(model.layers[1].weight)
    del model.layers[1]
    model(x)
    assert removed() is None  # a removed layer's tensors are not held by a snapshot
    alive = weakref.ref(model)
    del model, handle, deep
    gc.collect()
    assert alive() is None  # hooks and the snapshot cache leave the cycle collectable


# ---- @same_device -----------------------------------------------------------------------------------------

def test_same_device_on_forward_counts_the_modules_parameters_and_names_arguments():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        @gpuguard.same_device
        def forward(self, x, mask=None):
            return self.proj(x)

    net = Net()
    assert net(torch.zeros(2, 4), mask=torch.ones(2)).shape == (2, 4)
    net.to("meta")
    msg = str(mismatch(net, torch.empty(2, 4, device="meta"), mask=torch.ones(2)))
    assert "  meta: 2 parameters of Net: proj.*\n" in msg
    assert "  cpu: 1 input: mask (shape [2], float32)\n" in msg
    msg = str(mismatch(net, torch.zeros(2, 4)))
    assert "  cpu: 1 input: x (shape [2, 4], float32)\n" in msg


def test_same_device_on_a_plain_function_checks_its_tensor_arguments():
    @gpuguard.same_device
    def combine(a, b, *rest, scale=None):
        return a

    assert combine(torch.zeros(1), [torch.zeros(1)], torch.zeros(1), scale=torch.tensor(2.0)) is not None
    msg = str(mismatch(combine, torch.zeros(1), torch.zeros(1), torch.zeros(1, device="meta")))
    assert "  meta: 1 input: rest[0] (shape [1], float32)" in msg
    assert combine.__name__ == "combine"


# ---- guard ------------------------------------------------------------------------------------------------

def test_guard_checks_keyword_arguments_and_remove_stops_it():
    model = Stack(2)
    handle = gpuguard.guard(model)
    mask = torch.zeros(2, device="meta")
    msg = str(mismatch(model, torch.zeros(2, 4), mask=mask))
    assert "  meta: 1 input: mask (shape [2], float32)" in msg
    handle.remove()
    handle.remove()  # idempotent
    assert model(torch.zeros(2, 4), mask=mask).shape == (2, 4)
    assert "removed" in repr(handle)


def test_deep_guard_passes_a_model_split_on_purpose():
    model = Split()
    with gpuguard.guard(model, deep=True) as handle:
        assert handle.hooked_layers == ["layers.0", "layers.1", "layers.2", "layers.3"]
        assert model(torch.zeros(2, 4)).device == META
    # the whole-model check says the model is split, and where its inputs belong, instead of one device
    err = mismatch(gpuguard.assert_same_device, model, torch.zeros(2, 4, device="meta"))
    assert str(err).startswith("gpuguard: the model (Split) is split: its parameters and buffers are on 2 devices "
                               "(cpu, meta)")
    assert 'put the inputs where its first parameter (layers.0.weight) is: x = x.to("cpu")' in err.fix
    assert 'If the split is a mistake, move the stray part to the rest: model.get_submodule("layers.2").to("cpu"); ' \
           'model.get_submodule("layers.3").to("cpu").' in err.fix
    # and following the advice works: inputs where the first parameter is
    with gpuguard.guard(model, deep=True):
        assert model(torch.zeros(2, 4).to(next(model.parameters()).device)).device == META


def test_deep_guard_names_the_misplaced_third_layer():
    model = Split(misplace_third=True)
    handle = gpuguard.guard(model, deep=True)
    err = mismatch(model, torch.zeros(2, 4))
    msg = str(err)
    assert err.layer == "layers.2"
    assert msg.startswith("gpuguard: layer 'layers.2' (Linear) is about to run on tensors from 2 devices (meta, cpu); "
                          "PyTorch would stop inside this layer with \"Expected all tensors to be on the same "
                          "device\".\n")
    assert "  meta: 2 parameters of 'layers.2': weight, bias\n" in msg
    assert "  cpu: 1 input: input (shape [2, 4], float32)\n" in msg
    # layers.2 alone is on meta and the layers before it ran on cpu: put it with them
    assert err.cause == ("Likely cause: 'layers.2' alone was placed on meta: the layers before it ran on cpu and no "
                         "other part of the model is on meta.")
    assert msg.endswith('Fix: put the layer with the layers before it: model.get_submodule("layers.2").to("cpu").')
    handle.remove()
    with pytest.raises(RuntimeError):  # what PyTorch says without gpuguard: no layer named
        model(torch.zeros(2, 4))


def test_deep_guard_checks_keyword_arguments():
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(4, 4)

        def forward(self, x, *, mask):
            return self.q(x) * mask

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attn()

        def forward(self, x, mask):
            return self.attn(x, mask=mask)

    net = Net()
    with gpuguard.guard(net, deep=True) as handle:
        assert handle.hooked_layers == ["attn.q"]
        net(torch.zeros(2, 4), torch.ones(4))
        net.attn.register_parameter("bias", nn.Parameter(torch.zeros(4)))  # attn now owns a parameter
        err = mismatch(net, torch.zeros(2, 4), torch.ones(4, device="meta"))
        assert err.layer == "attn"
        assert "  meta: 1 input: mask (shape [4], float32)" in str(err)
        assert handle.hooked_layers == ["attn", "attn.q"]


def test_deep_guard_hooks_layers_added_later():
    model = Split()
    handle = gpuguard.guard(model, deep=True)
    model(torch.zeros(2, 4))
    model.layers.append(nn.Linear(4, 4))  # on cpu, but the activation arrives on meta
    model.forward = lambda x: model.layers[4](Split.forward(model, x))  # type: ignore[method-assign]
    err = mismatch(model, torch.zeros(2, 4))
    assert err.layer == "layers.4"
    assert "layers.4" in handle.hooked_layers
    handle.remove()


def test_disable_makes_every_check_a_no_op(monkeypatch):
    model = Stack(2).to("meta")
    x = torch.zeros(2, 4)
    handle = gpuguard.guard(model)
    monkeypatch.setenv("GPUGUARD_DISABLE", "1")
    assert gpuguard.assert_same_device(model, x) is None
    with pytest.raises(RuntimeError) as info:
        model(x)  # PyTorch's own error, not gpuguard's
    assert not isinstance(info.value, gpuguard.DeviceMismatchError)
    monkeypatch.setenv("GPUGUARD_DISABLE", "0")
    mismatch(model, x)
    handle.remove()


def test_guard_rejects_what_is_not_a_module():
    with pytest.raises(TypeError, match="gpuguard.guard expects an nn.Module, not Tensor"):
        gpuguard.guard(torch.zeros(1))  # type: ignore[arg-type]


def test_names_compress_into_subtrees_and_ranges():
    from gpuguard.tensors.implementation import tensor_checks

    compress_names = tensor_checks().compress_names

    names = [f"layers.{i}.{p}" for i in range(16) for p in ("weight", "bias")]
    assert compress_names(names, names + ["head.weight"]) == ["layers.*"]
    assert compress_names(names[:10], names) == ["layers.0-4.*"]
    assert compress_names(["layers.0.weight", "layers.2.weight", "layers.3.weight"], names) == [
        "layers.0.weight", "layers.2-3.weight"]
    assert compress_names(["blocks.01.w", "blocks.02.w"], ["blocks.01.w", "blocks.02.w", "blocks.01.b"]) == [
        "blocks.01.w", "blocks.02.w"]  # "01" is a name, not an index
    assert compress_names(["weight"], ["weight", "bias"]) == ["weight"]


@pytest.mark.slow
def test_dtensor_and_fsdp_flat_parameters_do_not_crash(tensor_checks_impl):
    got = run_json(in_python_if(tensor_checks_impl, """
        import json, os, torch, torch.distributed as dist
        from torch import nn
        import gpuguard
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        from torch.distributed.tensor import DTensor, Replicate, init_device_mesh
        from torch.distributed.fsdp._flat_param import FlatParameter
        mesh = init_device_mesh("cpu", (1,))
        model = nn.Linear(4, 4)
        model.weight = nn.Parameter(DTensor.from_local(torch.zeros(4, 4), mesh, [Replicate()]))
        flat = FlatParameter(torch.zeros(20), requires_grad=True)
        holder = nn.Module(); holder.register_parameter("_flat_param", flat)
        out = {"dtensor": str(gpuguard.assert_same_device(model, torch.zeros(2, 4))),
               "flat": str(gpuguard.assert_same_device(holder, torch.zeros(1)))}
        try:
            gpuguard.assert_same_device(model, torch.zeros(2, 4, device="meta"))
        except gpuguard.DeviceMismatchError as e:
            out["names"] = e.groups[0]["parameters"]
        dist.destroy_process_group()
        print(json.dumps(out))
    """), no_driver_env())
    assert got == {"dtensor": "cpu", "flat": "cpu", "names": ["weight", "bias"]}


def test_mismatch_messages_stay_on_short_lines_of_facts():
    model = Stack(200).to("meta")
    msg = str(mismatch(gpuguard.assert_same_device, model, torch.zeros(2, 4)))
    assert "layers.*" in msg and "layers.0.weight" not in msg
    assert len(msg) < 1200
    assert re.search(r"^Fix: ", msg, re.M)


# ---- hostile input: nesting deeper than the C stack allows --------------------------------------------------

DEEP_INPUTS = r"""
import json, torch, torch.nn as nn, gpuguard
x = torch.zeros(1)
out = {}

def attempt(name, fn):
    try:
        fn()
        out[name] = "no error"
    except ValueError as e:
        out[name] = str(e)

nested_list = [x]
for _ in range(75_000):
    nested_list = [nested_list]
attempt("list", lambda: gpuguard.assert_same_device(x, nested_list))
nested_dict = {"t": x}
for _ in range(75_000):
    nested_dict = {"n": nested_dict}
attempt("dict", lambda: gpuguard.assert_same_device(x, nested_dict))
root = nn.Linear(1, 1)
module = root
for _ in range(48_700):
    child = nn.Module()
    module.add_module("c", child)
    module = child
attempt("module", lambda: gpuguard.assert_same_device(root, x))
handle = gpuguard.guard(root)
attempt("guarded_forward", lambda: root(x))
handle.remove()
within = [x]
for _ in range(900):
    within = [within]
out["within_the_bound"] = str(gpuguard.assert_same_device(x, within))
print(json.dumps(out))
"""


def test_nesting_deeper_than_the_stack_allows_raises_instead_of_crashing(tensor_checks_impl):
    """Before: a list or dict nested 75,000 deep, or a module tree 48,700 deep, ended the process with SIGSEGV
    (the C++ walk recursed once per level). Run in a fresh interpreter, so that a crash fails the test."""
    got = run_json(in_python_if(tensor_checks_impl, DEEP_INPUTS), no_driver_env(), timeout=300)
    for case in ("list", "dict"):
        assert got[case].startswith("gpuguard stopped checking devices at 1000 levels of nesting: an argument "
                                    "(lists, tuples, dicts or dataclasses inside each other) nests deeper than "
                                    "that."), got[case]
        assert got[case].endswith("Pass the tensors themselves, or a flatter structure holding them.")
    for case in ("module", "guarded_forward"):
        assert got[case].startswith("gpuguard stopped checking devices at 1000 levels of nesting: the module tree "
                                    "(submodules inside submodules) nests deeper than that."), got[case]
        assert "assert_same_device(model.sub), guard(model.sub)" in got[case]
    assert got["within_the_bound"] == "cpu"
