"""The tensor checks' Python implementation (gpuguard.tensors._python_checks, what runs where gpuguard._libtorch cannot load)
against the compiled one: the same verdict, message, cause, fix and fields, byte for byte, case by case.

test_tensor_devices*.py run every test against both implementations; here each case is run by both in turn and
the two outcomes are compared whole, so that any difference in wording fails even where those tests only look for
a phrase. FakeTensorMode gives tensors cuda:N devices without a GPU.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import pytest
import torch
from torch import nn

import gpuguard
from gpuguard import _libtorch_loader
from gpuguard.tensors import _python_checks, implementation as chosen

pytestmark = pytest.mark.follows_torch

Outcome = tuple[Any, ...]


def outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        result = fn()
    except gpuguard.DeviceMismatchError as error:
        return ("raised", str(error), error.fix, dict(error.details))
    except ValueError as error:
        return ("ValueError", str(error))
    return ("returned", str(result))


def by_both(monkeypatch: pytest.MonkeyPatch, make: Callable[[], Callable[[], Any]]) -> Outcome:
    """``make()`` builds a case (a model, hooks, inputs) and returns the call to check; it is built and called once
    with each implementation (hooks are made by the implementation in use when guard() runs). Returns the
    compiled one's outcome after asserting that the Python one's is identical."""
    outcomes = []
    for implementation in (_libtorch_loader.libtorch(), _python_checks):
        monkeypatch.setattr(chosen, "_checks", implementation)
        outcomes.append(outcome(make()))
    compiled, python = outcomes
    assert python == compiled
    return compiled


class Stack(nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))
        self.norm = nn.LayerNorm(4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) * self.scale


Point = collections.namedtuple("Point", "a b")


@dataclasses.dataclass
class Batch:
    x: Any
    extra: Any = None


def model_cases() -> dict[str, Callable[[], Callable[[], Any]]]:
    """assert_same_device, @same_device and guard() on cpu and meta: every branch of the whole-model report."""

    def moved(n: int, which: slice) -> nn.Module:
        model = Stack(n)
        model.layers[which].to("meta")
        return model

    def tied() -> Callable[[], Any]:
        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
        model[1].weight = model[0].weight
        return lambda: gpuguard.assert_same_device(model, torch.zeros(2, dtype=torch.long, device="meta"))

    def decorated() -> Callable[[], Any]:
        @gpuguard.same_device
        def step(batch, *rest, scale=None):
            return batch

        return lambda: step(torch.zeros(2), torch.zeros(3, device="meta"), [torch.zeros(1)],
                            scale=torch.zeros(4, 4, device="meta"))

    def guarded(model: nn.Module, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        gpuguard.guard(model)
        return lambda: model(*args, **kwargs)

    def nested(n: int) -> Any:
        value: Any = torch.zeros(1)
        for _ in range(n):
            value = [value]
        return value

    def one_weight_moved() -> nn.Module:
        model = Stack(3)
        model.layers[1].weight = nn.Parameter(torch.zeros(4, 4, device="meta"))
        return model

    def root_buffer_moved() -> nn.Module:
        model = Stack(2)
        model._buffers["scale"] = torch.ones(4, device="meta")
        return model

    def buffers_only() -> nn.Module:
        model = nn.BatchNorm1d(4, affine=False)
        model._buffers["running_var"] = model.running_var.to("meta")
        return model

    return {
        "agree": lambda: lambda: gpuguard.assert_same_device(Stack(2), torch.zeros(2, 4), torch.tensor(1.0)),
        "no tensors": lambda: lambda: gpuguard.assert_same_device(nn.ReLU(), None, 3),
        "scalars only": lambda: lambda: gpuguard.assert_same_device(torch.tensor(2.0), [torch.tensor(1)]),
        "inputs on another device": lambda: lambda: gpuguard.assert_same_device(Stack(4), torch.zeros(2, 4,
                                                                                             device="meta")),
        "whole model moved": lambda: lambda: gpuguard.assert_same_device(Stack(40).to("meta"), torch.zeros(2, 4)),
        "a range of layers moved": lambda: lambda: gpuguard.assert_same_device(moved(16, slice(3, 9)),
                                                                               torch.zeros(2, 4)),
        "one weight moved": lambda: lambda: gpuguard.assert_same_device(one_weight_moved()),
        "a buffer of the root moved": lambda: lambda: gpuguard.assert_same_device(root_buffer_moved()),
        "buffers only": lambda: lambda: gpuguard.assert_same_device(buffers_only(), torch.zeros(2, 4)),
        "many scattered layers": lambda: lambda: gpuguard.assert_same_device(moved(60, slice(1, None, 2))),
        "expected, model elsewhere": lambda: lambda: gpuguard.assert_same_device(Stack(3), torch.zeros(2, 4),
                                                                                 expected="meta"),
        "expected, inputs elsewhere": lambda: lambda: gpuguard.assert_same_device(
            torch.zeros(1, device="meta"), {"mask": [torch.zeros(2, 3)], 7: torch.zeros(1)}, expected="meta"),
        "nested inputs named": lambda: lambda: gpuguard.assert_same_device(
            torch.zeros(1), Point(torch.zeros(2), [torch.zeros(3, device="meta")]),
            Batch(x={"k": (torch.zeros(1, dtype=torch.int64, device="meta"),)})),
        "tied weights named once": tied,
        "same_device names arguments": decorated,
        "guard names forward's arguments": lambda: guarded(Stack(3), torch.zeros(2, 4, device="meta"),
                                                           mask=torch.zeros(2, device="meta")),
        "guard, split model": lambda: guarded(moved(6, slice(0, 2)), torch.zeros(2, 4)),
        "too deep for the walk": lambda: lambda: gpuguard.assert_same_device(torch.zeros(1), nested(1_200)),
        "deep, but within the bound": lambda: lambda: gpuguard.assert_same_device(torch.zeros(1), nested(990)),
        "dtypes and shapes": lambda: lambda: gpuguard.assert_same_device(
            torch.zeros(2, 0, 3, dtype=torch.bfloat16), torch.zeros((), dtype=torch.bool, device="meta"),
            torch.zeros(5, dtype=torch.complex64, device="meta")),
    }


@pytest.mark.parametrize("case", list(model_cases()))
def test_the_python_checks_answer_as_the_compiled_ones(case, monkeypatch):
    got = by_both(monkeypatch, model_cases()[case])
    # the cases mean what their names say: each ends as intended
    if case in ("agree", "scalars only", "deep, but within the bound"):
        assert got == ("returned", "cpu")
    elif case == "no tensors":
        assert got == ("returned", "None")
    elif case == "too deep for the walk":
        assert got[0] == "ValueError" and "1000 levels of nesting" in got[1]
    else:
        assert got[0] == "raised" and got[1].startswith("gpuguard: ") and "\nFix: " in got[1]


# ---- placed across GPUs (FakeTensorMode), whole models and guard(deep=True) layer by layer ----------------------

class Decoder(nn.Module):
    def __init__(self, placement: dict[str, str], device: str = "cuda:0", make_on: str = "",
                 hand_over: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8, device=placement.get("embed", device))
        self.blocks = nn.ModuleList(nn.Linear(8, 8, device=placement.get(f"blocks.{i}", device)) for i in range(4))
        self.head = nn.Linear(8, 2, device=placement.get("head", device))
        self.make_on = make_on
        self.hand_over = hand_over and not make_on  # forward moves each activation to the next layer's device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for i, block in enumerate(self.blocks):
            if self.make_on and i == 2:
                x = torch.ones(2, 8, device=self.make_on)  # a tensor made inside forward, on another device
            x = block(x.to(block.weight.device) if self.hand_over else x)
        return self.head(x.to(self.head.weight.device) if self.hand_over else x)


SPLIT = {"embed": "cuda:0", "blocks.0": "cuda:0", "blocks.1": "cuda:1", "blocks.2": "cuda:2",
         "blocks.3": "cuda:3", "head": "cuda:3"}


def fake_cases() -> dict[str, Callable[[], Callable[[], Any]]]:
    def deep(model: nn.Module, x: torch.Tensor) -> Callable[[], Any]:
        gpuguard.guard(model, deep=True)
        return lambda: model(x)

    def half_layer() -> nn.Module:
        model = Decoder({})
        model.blocks[1].bias = nn.Parameter(torch.zeros(8, device="cuda:1"))
        return model

    def stray_block() -> nn.Module:
        model = Decoder({}, hand_over=False)
        model.blocks[2] = nn.Linear(8, 8, device="cuda:1")
        return model

    def unhanded() -> nn.Module:
        model = Decoder(SPLIT)
        model.forward = lambda x: model.head(model.blocks[3](model.blocks[2](model.embed(x))))  # no hand-over
        return model

    def layer_called_directly() -> Callable[[], Any]:
        model = Decoder(SPLIT)
        gpuguard.guard(model, deep=True)
        return lambda: model.blocks[2](torch.zeros(2, 8, device="cuda:0"))

    return {
        "split model, inputs on the last GPU": lambda: lambda: gpuguard.assert_same_device(
            Decoder(SPLIT), torch.zeros(2, 8, device="cuda:3")),
        "split model, inputs on the first GPU": lambda: lambda: gpuguard.assert_same_device(
            Decoder(SPLIT), torch.zeros(2, 8, device="cuda:0")),
        "one GPU, inputs on another": lambda: lambda: gpuguard.assert_same_device(
            Decoder({}), torch.zeros(2, 8, device="cuda:1")),
        "a stray block": lambda: lambda: gpuguard.assert_same_device(stray_block(), torch.zeros(2, 8,
                                                                                          device="cuda:0")),
        "expected cuda:2": lambda: lambda: gpuguard.assert_same_device(Decoder(SPLIT), expected="cuda:2"),
        "deep: split, inputs by hand on cuda:3": lambda: deep(Decoder(SPLIT), torch.zeros(2, 8, device="cuda:3")),
        "deep: one GPU, inputs on another": lambda: deep(Decoder({}), torch.zeros(2, 8, device="cuda:1")),
        "deep: a layer in two pieces": lambda: deep(half_layer(), torch.zeros(2, 8, device="cuda:0")),
        "deep: made on the CPU in forward": lambda: deep(Decoder({}, make_on="cpu"),
                                                         torch.zeros(2, 8, device="cuda:0")),
        "deep: made on another GPU in forward": lambda: deep(Decoder(SPLIT, make_on="cuda:3"),
                                                             torch.zeros(2, 8, device="cuda:0")),
        "deep: a block placed alone": lambda: deep(stray_block(), torch.zeros(2, 8, device="cuda:0")),
        "deep: no hand-over between stages": lambda: deep(unhanded(), torch.zeros(2, 8, device="cuda:0")),
        "deep: the layer called directly": layer_called_directly,
    }


@pytest.mark.parametrize("case", list(fake_cases()))
def test_the_python_checks_advise_as_the_compiled_ones(case, monkeypatch, fake):
    got = by_both(monkeypatch, fake_cases()[case])
    assert got[0] == "raised" and "\nFix: " in got[1], got


def test_the_python_checks_compress_names_as_the_compiled_ones():
    names = [f"layers.{i}.{p}" for i in range(16) for p in ("weight", "bias")]
    cases = [(names, names + ["head.weight"]), (names[:10], names), (names[::3], names),
             (["layers.0.weight", "layers.2.weight", "layers.3.weight"], names),
             (["blocks.01.w", "blocks.02.w"], ["blocks.01.w", "blocks.02.w", "blocks.01.b"]),
             (["weight"], ["weight", "bias"]), (["a.1.b.2.c", "a.1.b.3.c", "a.2.b.3.c", "a..x", "a..y"], []),
             ([f"h.{i}.attn.{j}" for i in range(12) for j in (0, 1, 2, 5)], [])]
    compiled = _libtorch_loader.libtorch().compress_names
    for names_, universe in cases:
        assert _python_checks.compress_names(names_, universe) == compiled(names_, universe)
