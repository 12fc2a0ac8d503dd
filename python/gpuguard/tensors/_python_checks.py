"""The tensor checks in pure Python: what gpuguard._libtorch computes, for when it cannot load.

gpuguard._libtorch is bound to the torch it was compiled against; after a torch upgrade (or in a build without it)
implementation.tensor_checks() hands this module to tensor_devices.py instead, so that a pip upgrade never stops a
job. It offers the same functions and classes as the compiled module's tensor part (check_call, forward_hook,
layer_hook, DeepGuard, run_traced, compress_names, checks_disabled) and must write byte-identical reports: each
function below ports the C++ one named in its docstring (csrc/python/libtorch/collect_tensors.cc, device_check.cc,
csrc/gpuguard/tensor_devices.cc), and tests/python/test_tensor_devices*.py run every case against both. Keep the two
in step when either changes.

It is slower (it walks the module tree in Python on every check, where the C++ keeps a snapshot that dict watchers
invalidate); benchmarks/bench_tensor_devices.py measures by how much.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..errors import DeviceMismatchError

__all__ = ["DeepGuard", "check_call", "checks_disabled", "compress_names", "forward_hook", "layer_hook",
           "run_traced"]

# ---- walking modules and arguments (collect_tensors.cc) -------------------------------------------------------

# The C++ walks stop here rather than overflow the C stack; these walks are iterative, and stop at the same depth
# with the same words, so that both paths accept exactly the same inputs.
MAX_NESTING = 1000

PARAMETER, BUFFER, INPUT = 0, 1, 2

_EXACT_TENSORS = (torch.Tensor, nn.Parameter)  # THPVariable_CheckExact: Tensor, and Parameter, which C++ treats alike
_PLAIN_LEAVES = (int, float, str, bytes, complex)  # exact types only, as is_plain_leaf checks them (bool too)


def _too_deep(what: str, advice: str) -> ValueError:
    return ValueError(f"gpuguard stopped checking devices at {MAX_NESTING} levels of nesting: {what} nests deeper "
                      f"than that. It stops there instead of overflowing the C stack, so nothing past it was "
                      f"checked. {advice}")


def _module_dicts(module: Any) -> tuple[Optional[dict], Optional[dict], Optional[dict]]:
    """module_dicts(): _parameters, _buffers and _modules from the instance __dict__ (not nn.Module.__getattr__)."""
    try:
        d = object.__getattribute__(module, "__dict__")
    except (AttributeError, TypeError):
        return None, None, None
    if not isinstance(d, dict):
        return None, None, None
    found = []
    for key in ("_parameters", "_buffers", "_modules"):
        v = d.get(key)
        found.append(v if isinstance(v, dict) else None)
    return found[0], found[1], found[2]


def _module_tensors(module: Any, recurse: bool, named: bool) -> list[tuple[int, str, Any]]:
    """walk_module() with the agreement (named=False) or naming (named=True) visitor: (role, qualified name, tensor)
    for each parameter and buffer, a module's own before its children's, depth first. Named, each tensor object is
    listed once (tied weights keep their first name, as named_parameters() does)."""
    out: list[tuple[int, str, Any]] = []
    modules_seen: set[int] = set()
    tensors_seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(module, "", 0)]
    while stack:
        mod, prefix, depth = stack.pop()
        if recurse:
            if id(mod) in modules_seen:  # a module reachable twice, or a cycle
                continue
            modules_seen.add(id(mod))
        if depth > MAX_NESTING:
            raise _too_deep("the module tree (submodules inside submodules)",
                            "Check a part of it (assert_same_device(model.sub), guard(model.sub)), or flatten the "
                            "chain into an nn.Sequential or nn.ModuleList.")
        parameters, buffers, children = _module_dicts(mod)
        for role, tensors in ((PARAMETER, parameters), (BUFFER, buffers)):
            if not tensors:
                continue
            for key, value in tensors.items():
                if isinstance(value, torch.Tensor):
                    if named:
                        if id(value) in tensors_seen:
                            continue
                        tensors_seen.add(id(value))
                        out.append((role, prefix + str(key), value))
                    else:
                        out.append((role, "", value))
        if recurse and children:
            pending = [(child, prefix + str(key) + "." if named else "", depth + 1)
                       for key, child in children.items() if child is not None]
            stack.extend(reversed(pending))
    return out


def _key_repr(key: Any) -> str:
    return "'" + key + "'" if isinstance(key, str) else repr(key)


def _input_tensors(obj: Any, path: str, seen: set[int], named: bool, out: list[tuple[str, Any]]) -> None:
    """walk_input(): every tensor inside ``obj`` with its path ("[i]" in a list or tuple, ".field" in a namedtuple
    or dataclass, "['key']" in a dict), depth first; ``seen`` holds the containers already walked in this call."""
    stack: list[tuple[Any, str, int]] = [(obj, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        kind = type(item)
        if item is None or kind in _PLAIN_LEAVES or kind is bool:
            continue
        if kind in _EXACT_TENSORS:
            out.append((where, item))
            continue
        if depth > MAX_NESTING:
            raise _too_deep("an argument (lists, tuples, dicts or dataclasses inside each other)",
                            "Pass the tensors themselves, or a flatter structure holding them.")
        children: list[tuple[Any, str, int]] = []
        if isinstance(item, (tuple, list)):
            if id(item) in seen:  # a reference cycle, or a container seen before
                continue
            seen.add(id(item))
            fields = None
            if named and isinstance(item, tuple) and kind is not tuple:
                fields = getattr(kind, "_fields", None)  # a namedtuple: fields by name
                if not isinstance(fields, tuple):
                    fields = None
            for i, value in enumerate(item):
                if not named:
                    sub = ""
                elif fields is not None and i < len(fields):
                    sub = where + "." + str(fields[i])
                else:
                    sub = where + "[" + str(i) + "]"
                children.append((value, sub, depth + 1))
        elif isinstance(item, dict):
            if id(item) in seen:
                continue
            seen.add(id(item))
            for key, value in list(item.items()):
                children.append((value, where + "[" + _key_repr(key) + "]" if named else "", depth + 1))
        elif isinstance(item, torch.Tensor):  # tensor subclasses
            out.append((where, item))
            continue
        else:
            fields = None if isinstance(item, type) else _type_attribute(kind, "__dataclass_fields__")
            if not isinstance(fields, dict) or id(item) in seen:
                continue
            seen.add(id(item))
            for key in list(fields):
                try:
                    value = getattr(item, key)
                except Exception:  # noqa: BLE001 - a field without a value (init=False, never set): nothing to check
                    continue
                children.append((value, where + "." + str(key) if named else "", depth + 1))
        stack.extend(reversed(children))


def _type_attribute(kind: type, name: str) -> Any:
    """_PyType_Lookup: ``name`` in the type's MRO dicts, without descriptors or metaclass getattr."""
    for base in kind.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    return None


# ---- deciding (tensor_devices.h: DeviceAgreement) -----------------------------------------------------------------

class _Agreement:
    """DeviceAgreement: do the tensors share one device? A 0-dim CPU tensor (a scalar) agrees with any device and
    only decides the device ("cpu") when nothing else is seen."""

    __slots__ = ("device", "cpu_scalar", "agree")

    def __init__(self, expected: Optional[torch.device] = None) -> None:
        self.device = expected
        self.cpu_scalar = False
        self.agree = True

    def add(self, t: Any) -> None:
        d = t.device
        if self.device is not None and self.device == d:
            return
        if d.type == "cpu" and t.dim() == 0:
            self.cpu_scalar = True
            return
        if self.device is None:
            self.device = d
            return
        self.agree = False

    def common(self) -> Optional[torch.device]:
        if self.device is not None:
            return self.device
        return torch.device("cpu") if self.cpu_scalar else None


def _is_cpu_scalar(t: Any) -> bool:
    return t.device.type == "cpu" and t.dim() == 0


# ---- the report (tensor_devices.cc) --------------------------------------------------------------------------

def _as_index(token: str) -> Optional[int]:
    if not token or len(token) > 15 or (len(token) > 1 and token[0] == "0"):
        return None
    if any(c not in "0123456789" for c in token):
        return None
    return int(token)


def _count_under_prefixes(names: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        i = name.find(".")
        while i != -1:
            prefix = name[:i]
            counts[prefix] = counts.get(prefix, 0) + 1
            i = name.find(".", i + 1)
    return counts


class _Run:
    __slots__ = ("tokens", "position", "first", "last")

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = -1
        self.first = 0
        self.last = 0

    def extend(self, tokens: list[str]) -> bool:
        """extend_run(): take ``tokens`` when they continue the run: equal but for one index token, one higher."""
        if len(self.tokens) != len(tokens):
            return False
        if self.position >= 0:
            for i, token in enumerate(tokens):
                if i != self.position and token != self.tokens[i]:
                    return False
            v = _as_index(tokens[self.position])
            if v is None or v != self.last + 1:
                return False
            self.last = v
            return True
        differs = -1
        for i, token in enumerate(tokens):
            if token == self.tokens[i]:
                continue
            if differs >= 0:
                return False
            differs = i
        if differs < 0:
            return False
        a, b = _as_index(self.tokens[differs]), _as_index(tokens[differs])
        if a is None or b is None or b != a + 1:
            return False
        self.position, self.first, self.last = differs, a, b
        return True


def compress_names(names: list[str], universe: list[str]) -> list[str]:
    """compress_names(): whole subtrees become "prefix.*", runs of consecutive indices ranges ("layers.0-15.*")."""
    in_universe = _count_under_prefixes(universe if universe else names)
    in_names = _count_under_prefixes(names)
    items: list[str] = []
    emitted: set[str] = set()
    for name in names:
        item = name
        i = name.find(".")
        while i != -1:
            prefix = name[:i]
            u, n = in_universe.get(prefix), in_names.get(prefix)
            if u is not None and n is not None and u == n and u >= 2:
                item = prefix + ".*"
                break
            i = name.find(".", i + 1)
        if item not in emitted:
            emitted.add(item)
            items.append(item)
    runs: list[_Run] = []
    look_back = 8
    for item in items:
        tokens = item.split(".")
        extended = False
        for k in range(min(len(runs), look_back)):
            if runs[len(runs) - 1 - k].extend(tokens):
                extended = True
                break
        if not extended:
            runs.append(_Run(tokens))
    out = []
    for run in runs:
        if run.position >= 0:
            run.tokens[run.position] = f"{run.first}-{run.last}"
        out.append(".".join(run.tokens))
    return out


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _quoted(s: str) -> str:
    return '"' + s + '"'


def _join(items: list[str], sep: str, limit: int) -> str:
    shown = items[:limit]
    out = sep.join(shown)
    if len(shown) < len(items):
        out += sep + f"… ({len(items) - len(shown)} more)"
    return out


_IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _is_identifier(s: str) -> bool:
    return bool(s) and s[0] not in "0123456789" and all(c in _IDENTIFIER_CHARS for c in s)


def _dtype_name(t: Any) -> str:
    return str(t.dtype).rsplit(".", 1)[-1]  # torch.float32 -> "float32", as c10::getDtypeNames names it


def _owner_of(name: str) -> str:
    dot = name.rfind(".")
    return "" if dot == -1 else name[:dot]


_ONE_GPU = ("to run it on one GPU instead, make only that GPU visible before the process starts "
            "(CUDA_VISIBLE_DEVICES=0) and load it without a device map, so that every layer is placed there")


class _Group:
    """DeviceGroup: the tensors found on one device."""

    __slots__ = ("device", "parameters", "buffers", "inputs", "summary")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.parameters: list[str] = []
        self.buffers: list[str] = []
        self.inputs: list[dict[str, Any]] = []  # {"name", "shape", "dtype"}
        self.summary: list[str] = []

    def owns(self) -> bool:
        return bool(self.parameters or self.buffers)


class _Context:
    """CheckContext: what the check was about, for the wording of the report."""

    def __init__(self, expected: Optional[torch.device] = None, module: str = "", layer: str = "",
                 layer_type: str = "") -> None:
        self.expected = expected
        self.module = module
        self.layer = layer
        self.layer_type = layer_type
        self.model_devices: list[torch.device] = []
        self.first_parameter = ""
        self.others_on_layer_device = 0
        self.input_from_caller = True

    def copy(self) -> "_Context":
        other = _Context(self.expected, self.module, self.layer, self.layer_type)
        other.model_devices = list(self.model_devices)
        other.first_parameter = self.first_parameter
        other.others_on_layer_device = self.others_on_layer_device
        other.input_from_caller = self.input_from_caller
        return other


def _move_stray_parts(groups: list[_Group], home: torch.device) -> str:
    owners: list[str] = []
    root_owned = False
    for g in groups:
        if g.device == home:
            continue
        for names in (g.parameters, g.buffers):
            for n in names:
                o = _owner_of(n)
                if not o:
                    root_owned = True
                elif o not in owners:
                    owners.append(o)
    top = [o for o in owners
           if not any(p != o and len(o) > len(p) and o.startswith(p) and o[len(p)] == "." for p in owners)]
    to = ".to(" + _quoted(str(home)) + ")"
    if root_owned or not top or len(top) > 3:
        return ("each part listed above on another device to " + str(home) + " (a submodule with "
                "model.get_submodule(name)" + to + ")")
    return "; ".join("model.get_submodule(" + _quoted(o) + ")" + to for o in top)


def _cause_and_fix(groups: list[_Group], ctx: _Context) -> tuple[str, str]:
    """cause_and_fix(): the likely cause and the fix."""
    module_devices = [g.device for g in groups if g.owns()]
    has_module = bool(module_devices)
    home = ctx.expected if ctx.expected is not None else groups[0].device
    home_name = str(home)
    first_input = ""
    other: Optional[torch.device] = None
    for g in groups:
        if g.device == home:
            continue
        if other is None:
            other = g.device
        if g.inputs and not first_input:
            first_input = g.inputs[0]["name"]
    var = first_input if _is_identifier(first_input) else "x"
    other_name = str(other) if other is not None else home_name
    move_var = var + " = " + var + ".to("
    model = ctx.model_devices
    model_split = len(model) > 1
    first = str(model[0]) if model else home_name
    first_param = "its first parameter" + (" (" + ctx.first_parameter + ")" if ctx.first_parameter else "")

    if ctx.layer:
        layer = "model.get_submodule(" + _quoted(ctx.layer) + ")"
        if len(module_devices) > 1:
            to = home_name
            for g in groups:
                if g.inputs and g.owns():
                    to = str(g.device)
                    break
            return ("Likely cause: the layer's own parameters and buffers are split across devices (part of it was "
                    "moved or loaded on its own).",
                    "Fix: keep the layer in one piece: " + layer + ".to(" + _quoted(to) + ").")
        if not model:
            return ("Likely cause: its input was produced on " + other_name + " (by the layers before it, or by the "
                    "caller) and nothing moves it to " + home_name + " before '" + ctx.layer + "'; or '" +
                    ctx.layer + "' alone was placed on " + home_name + ".",
                    "Fix: if the model is split across devices on purpose, move the activation in the parent's "
                    "forward before calling this layer: " + move_var + _quoted(home_name) + "); otherwise put the "
                    "layer with the rest: " + layer + ".to(" + _quoted(other_name) + ").")
        input_on_model = other is not None and other in model
        if ctx.input_from_caller:
            if not model_split:
                return ("Likely cause: the inputs were put on " + other_name + " by the caller, but the whole model "
                        "is on " + home_name + " (for example moved by hand to a GPU of your choosing while a "
                        "framework placed the model on another).",
                        "Fix: move the inputs to the model's device before calling it: " + move_var +
                        _quoted(home_name) + "), or " + var + ".to(next(model.parameters()).device).")
            if home == model[0]:
                return ("Likely cause: the model is placed across " + str(len(model)) + " devices (" +
                        _join([str(d) for d in model], ", ", 8) + "), " + first_param + " on " + first +
                        ", but the inputs were put on " + other_name + " by hand.",
                        "Fix: leave placement to whatever split the model and put the inputs where its first "
                        "parameter is: " + move_var + _quoted(first) + ") (next(model.parameters()).device); do not "
                        "move the whole model to one device. If the split was not wanted: " + _ONE_GPU + ".")
            return ("Likely cause: the model is placed across devices and its forward hands the input '" + var +
                    "' from its caller to '" + ctx.layer + "' on " + home_name + " as it is, on " + other_name + ".",
                    "Fix: move it in the parent's forward before calling this layer: " + move_var +
                    _quoted(home_name) + ") (a framework's device map does this for the layers it places); do not "
                    "move the whole model to one device.")
        if not model_split:
            if other is not None and other.type == "cpu" and home.type != "cpu":
                return ("Likely cause: this input was made inside the model's forward on the CPU (a tensor created "
                        "without device=, or a .cpu()), while the whole model is on " + home_name + ".",
                        "Fix: create it on the device of the tensors it meets, e.g. torch.arange(n, device=" + var +
                        ".device), or " + move_var + _quoted(home_name) + ") in the forward; keep constant tensors "
                        "as buffers (register_buffer) so that they move with the model.")
            return ("Likely cause: the model moves this activation to " + other_name + " itself (a .to(" +
                    _quoted(other_name) + ") in its forward, or a framework's hooks placing its layers by a device "
                    "map), so it expects its layers spread over devices, but all of its parameters and buffers are "
                    "on " + home_name + ": the whole model was moved to one device (model.to()) after it was placed.",
                    "Fix: leave placement to the framework: do not move a model it placed (load it again with its "
                    "device map, without model.to()) and put the inputs where its first parameter is "
                    "(next(model.parameters()).device); " + _ONE_GPU + ", or remove the hard-coded .to() from the "
                    "forward.")
        if not input_on_model:
            return ("Likely cause: this input was made inside the model's forward on " + other_name + ", where none "
                    "of the model is (a tensor created without device=, or moved by a hard-coded .to()).",
                    "Fix: create it on the device of the tensors it meets, e.g. torch.arange(n, device=" + var +
                    ".device), or " + move_var + _quoted(home_name) + ") in the forward; keep constant tensors as "
                    "buffers (register_buffer) so that they move with the model.")
        if ctx.others_on_layer_device == 0:
            return ("Likely cause: '" + ctx.layer + "' alone was placed on " + home_name + ": the layers before it "
                    "ran on " + other_name + " and no other part of the model is on " + home_name + ".",
                    "Fix: put the layer with the layers before it: " + layer + ".to(" + _quoted(other_name) + ").")
        return ("Likely cause: the model is split across devices and the part on " + home_name + " starts at '" +
                ctx.layer + "', but nothing moves the activation from " + other_name + " to " + home_name +
                " before it.",
                "Fix: move it in the parent's forward before calling this layer: " + move_var + _quoted(home_name) +
                "), or let the framework that splits the model place it (its device map moves activations between "
                "devices); do not move the whole model or this layer.")

    if has_module and len(module_devices) > 1:
        inputs_on_first, any_input = True, False
        for g in groups:
            if not g.inputs:
                continue
            any_input = True
            if g.device != model[0]:
                inputs_on_first = False
        cause = ("Likely cause: the model is placed across devices on purpose (a device map, pipeline stages, a "
                 "framework putting layers on every visible GPU), or part of it was created, moved or loaded apart "
                 "from the rest (a submodule replaced after model.to(), a .to() on one submodule, "
                 "load_state_dict(assign=True) with tensors from another device).")
        fix = "Fix: if the split is deliberate, leave placement to the framework: "
        if not any_input or not inputs_on_first:
            fix += ("put the inputs where " + first_param + " is: " + move_var + _quoted(first) + ") "
                    "(next(model.parameters()).device); ")
        else:
            fix += "the inputs are already where " + first_param + " is, on " + first + "; "
        fix += ("never move the whole model to one device, and check it layer by layer with gpuguard.guard(model, "
                "deep=True); " + _ONE_GPU + ". If the split is a mistake, move the stray part to the rest: " +
                _move_stray_parts(groups, home) + ".")
        return cause, fix
    if ctx.expected is not None:
        cause = "Likely cause: these tensors were created, loaded or moved somewhere other than " + home_name + "."
        fix = "Fix: move them to " + home_name + ":"
        moved_model = False
        for g in groups:
            if g.device != home and g.owns():
                fix += " model.to(" + _quoted(home_name) + ")"
                moved_model = True
                break
        if first_input:
            fix += (";" if moved_model else "") + " " + move_var + _quoted(home_name) + ")"
        return cause, fix + "."
    if has_module:
        return ("Likely cause: the inputs were put on a different device than the model (for example moved by hand "
                "to a GPU of your choosing while a framework placed the model on another).",
                "Fix: move the inputs to the model's device: " + move_var + _quoted(home_name) + "), or take the "
                "device from the model: " + var + ".to(next(model.parameters()).device).")
    return "", "Fix: move the tensors to one device, e.g. " + move_var + _quoted(home_name) + ")."


def _check_devices(entries: list[tuple[int, str, Any]], context: _Context) -> tuple[Optional[torch.device], Any]:
    """check_devices(): (the common device, None) when the entries agree, else (None, the DeviceMismatchError)."""
    agreement = _Agreement(context.expected)
    for _, _, t in entries:
        agreement.add(t)
    if agreement.agree:
        return agreement.common(), None

    universe = [name for role, name, t in entries if role != INPUT and not _is_cpu_scalar(t)]
    groups: list[_Group] = []
    for role, name, t in entries:
        if _is_cpu_scalar(t):
            continue
        d = t.device
        group = next((g for g in groups if g.device == d), None)
        if group is None:
            group = _Group(d)
            groups.append(group)
        if role == PARAMETER:
            group.parameters.append(name)
        elif role == BUFFER:
            group.buffers.append(name)
        else:
            group.inputs.append({"name": name, "shape": [int(s) for s in t.shape], "dtype": _dtype_name(t)})
    expected = context.expected

    def order(g: _Group) -> tuple[int, int, int]:
        owned = len(g.parameters) + len(g.buffers)
        return (0 if expected is not None and g.device == expected else 1, -owned, -len(g.inputs) if owned == 0 else 0)

    groups.sort(key=order)  # stable: as much of the module on each keeps module order
    for g in groups:
        g.summary = compress_names(g.parameters + g.buffers, universe)

    device_list = [str(g.device) for g in groups]
    msg = "gpuguard: "
    if context.layer:
        msg += ("layer '" + context.layer + "'" + (" (" + context.layer_type + ")" if context.layer_type else "") +
                " is about to run on tensors from " + str(len(groups)) + " devices (" + _join(device_list, ", ", 8) +
                "); PyTorch would stop inside this layer with \"Expected all tensors to be on the same device\".\n")
    elif expected is not None:
        elsewhere = 0
        other = []
        for g in groups:
            if g.device == expected:
                continue
            elsewhere += len(g.parameters) + len(g.buffers) + len(g.inputs)
            other.append(str(g.device))
        msg += ("expected every tensor on " + str(expected) + ", but " +
                _plural(elsewhere, "tensor is", "tensors are") + " elsewhere (" + _join(other, ", ", 8) + ").\n")
    else:
        module_list = [str(g.device) for g in groups if g.owns()]
        if len(module_list) > 1:
            msg += ("the model" + (" (" + context.module + ")" if context.module else "") + " is split: its "
                    "parameters and buffers are on " + str(len(module_list)) + " devices (" +
                    _join(module_list, ", ", 8) + "), so no one device holds it and its inputs.\n")
        else:
            msg += ("tensors that must share one device are on " + str(len(groups)) + " devices: " +
                    _join(device_list, ", ", 8) + ".\n")
    owner = "'" + context.layer + "'" if context.layer else context.module
    for g in groups:
        label = "  " + str(g.device) + ": "
        if g.owns():
            what = _plural(len(g.parameters), "parameter", "parameters") if g.parameters else ""
            if g.buffers:
                what += (", " if what else "") + _plural(len(g.buffers), "buffer", "buffers")
            msg += label + what + (" of " + owner if owner else "") + ": " + _join(g.summary, ", ", 12) + "\n"
        if g.inputs:
            described = [f"{i['name']} (shape [{', '.join(str(s) for s in i['shape'])}], {i['dtype']})"
                         for i in g.inputs]
            msg += label + _plural(len(g.inputs), "input", "inputs") + ": " + _join(described, ", ", 6) + "\n"
    ctx = context.copy()
    if not ctx.layer:  # a whole model: where its parts are comes from the entries themselves
        ctx.model_devices = []
        first_seen = False
        for role, name, t in entries:
            if role == INPUT or _is_cpu_scalar(t):
                continue
            if t.device not in ctx.model_devices:
                ctx.model_devices.append(t.device)
            if not first_seen and role == PARAMETER:
                ctx.first_parameter = name
                first_seen = True
        if not first_seen:  # no parameter: the first buffer stands for it
            for role, name, t in entries:
                if role == BUFFER and not _is_cpu_scalar(t):
                    ctx.first_parameter = name
                    break
        # the first parameter's device first: that is where a framework that placed the model wants its inputs
        for role, name, t in entries:
            if name != ctx.first_parameter or role == INPUT:
                continue
            if t.device in ctx.model_devices:
                ctx.model_devices.remove(t.device)
                ctx.model_devices.insert(0, t.device)
            break
    cause, fix = _cause_and_fix(groups, ctx)
    if cause:
        msg += cause + "\n"
    msg += fix
    error = DeviceMismatchError(
        msg, fix=fix, cause=cause,
        groups=[{"device": str(g.device), "parameters": g.parameters, "buffers": g.buffers, "inputs": g.inputs,
                 "summary": g.summary} for g in groups],
        devices=[str(g.device) for g in groups],
        expected=str(expected) if expected is not None else None,
        layer=context.layer or None)
    return None, error


# ---- the checks as Python calls them (device_check.cc) ---------------------------------------------------------

_tracing = threading.local()  # t_tracing: set while a check runs for torch.compile's tracer (run_traced)


def _is_tracing() -> bool:
    return getattr(_tracing, "on", False)


def checks_disabled() -> bool:
    """GPUGUARD_DISABLE set to anything but "" or "0": every check is a no-op."""
    v = os.environ.get("GPUGUARD_DISABLE")
    return bool(v) and v != "0"


def _call_devices(args: Any, kwargs: Any, agreement: _Agreement) -> None:
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    if isinstance(args, tuple):
        for item in args:
            if type(item) in _EXACT_TENSORS:
                found.append(("", item))
            else:
                _input_tensors(item, "", seen, False, found)
    elif args is not None:
        _input_tensors(args, "", seen, False, found)
    if kwargs is not None and not (isinstance(kwargs, dict) and not kwargs):
        _input_tensors(kwargs, "", seen, False, found)
    for _, t in found:
        agreement.add(t)


def _describe_model_around(deep: "_DeepCall", entries: list[tuple[int, str, Any]], context: _Context) -> None:
    """describe_model_around(): where the rest of the model is, and whether the disagreeing input is the caller's."""
    root = deep.root_ref() if deep.root_ref is not None else None
    if root is None:
        return
    layer_device: Optional[torch.device] = None
    own: set[int] = set()
    for role, _, t in entries:
        if role == INPUT:
            continue
        own.add(id(t))
        if layer_device is None and not _is_cpu_scalar(t):
            layer_device = t.device
    model = _module_tensors(root, True, True)
    model = [e for e in model if e[0] == PARAMETER] + [e for e in model if e[0] != PARAMETER]
    first_seen = False
    for _, name, t in model:
        if _is_cpu_scalar(t):
            continue
        d = t.device
        if d not in context.model_devices:
            context.model_devices.append(d)
        if not first_seen:
            context.first_parameter = name
            first_seen = True
        if layer_device is not None and d == layer_device and id(t) not in own:
            context.others_on_layer_device += 1
    traced = _is_tracing() and deep.traced_in_root
    in_root = traced or deep.depth > 0
    context.input_from_caller = not in_root
    if in_root and layer_device is not None:
        caller = deep.traced_caller_inputs if traced else deep.caller_inputs
        for role, _, t in entries:
            if role == INPUT and t.device != layer_device and id(t) in caller:
                context.input_from_caller = True


def _report_or_raise(module: Any, recurse: bool, args: Any, kwargs: Any, context: _Context,
                     labels_fn: Callable[[int], Any], deep: Optional["_DeepCall"] = None) -> Optional[torch.device]:
    entries: list[tuple[int, str, Any]] = []
    if module is not None:
        entries.extend(_module_tensors(module, recurse, True))
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []
    if isinstance(args, tuple):
        try:
            labels = labels_fn(len(args))
        except Exception:  # noqa: BLE001 - names are a nicety; the report goes out with args[i]
            labels = None
        for i, item in enumerate(args):
            label = f"args[{i}]"
            if isinstance(labels, list) and i < len(labels) and isinstance(labels[i], str):
                label = labels[i]
            _input_tensors(item, label, seen, True, found)
    if isinstance(kwargs, dict):
        for key, value in kwargs.items():
            _input_tensors(value, str(key), seen, True, found)
    entries.extend((INPUT, name, t) for name, t in found)
    if deep is not None:
        _describe_model_around(deep, entries, context)
    device, error = _check_devices(entries, context)
    if error is not None:
        raise error
    return device


def _forward_labels(module: Any) -> Callable[[int], Any]:
    def labels(n: int) -> Any:
        from .arg_names import _forward_arg_names
        return _forward_arg_names(module, n)
    return labels


def check_call(module: Any, args: Any, kwargs: Any, expected: Optional[torch.device], labels: Any) -> Any:
    """check_call(): the common device of a module's parameters and buffers (module may be None) and every tensor
    in args/kwargs; None when there is none. Raises DeviceMismatchError."""
    with torch._C.DisableTorchFunctionSubclass():  # read tensors as the C++ does, past subclasses' Python
        agreement = _Agreement(expected)
        if module is not None:
            for _, _, t in _module_tensors(module, True, False):
                agreement.add(t)
        _call_devices(args, kwargs, agreement)
        if agreement.agree:
            return agreement.common()
        context = _Context(expected, type(module).__name__ if module is not None else "")

        def labels_fn(n: int) -> Any:
            return None if labels is None else labels(n)

        return _report_or_raise(module, True, args, kwargs, context, labels_fn)


def _hook_check(module: Any, whole_tree: bool, args: Any, kwargs: Any, context: Callable[[], "_Context"],
                call: Optional["_DeepCall"] = None) -> None:
    """One pre-hook's check: the module's tensors (the whole tree, or its own) against the call's inputs; the report
    (its context made only then) when they disagree."""
    if checks_disabled():
        return
    with torch._C.DisableTorchFunctionSubclass():
        agreement = _Agreement()
        for _, _, t in _module_tensors(module, whole_tree, False):
            agreement.add(t)
        _call_devices(args, kwargs, agreement)
        if not agreement.agree:
            _report_or_raise(module, whole_tree, args, kwargs, context(), _forward_labels(module), call)


class _ForwardGuard:
    """guard(module)'s forward pre-hook (with_kwargs=True): the whole tree against the call's inputs. Walks the tree
    on every call (the C++ keeps a snapshot that dict watchers invalidate; Python has no such cheap signal)."""

    __name__ = "gpuguard_forward_check"

    def __call__(self, module: Any, args: Any, kwargs: Any = None) -> None:
        _hook_check(module, True, args, kwargs, lambda: _Context(module=type(module).__name__))


class _LayerGuard:
    """guard(module, deep=True)'s pre-hook of one layer: its own parameters and buffers against its inputs."""

    __name__ = "gpuguard_layer_check"

    def __init__(self, name: str, type_name: str, call: Optional["_DeepCall"] = None) -> None:
        self._name = name
        self._type = type_name
        self._call = call

    def __call__(self, module: Any, args: Any, kwargs: Any = None) -> None:
        _hook_check(module, False, args, kwargs,
                    lambda: _Context(module=type(module).__name__, layer=self._name or "<root>", layer_type=self._type),
                    self._call)


def forward_hook() -> Callable[..., None]:
    """A new forward pre-hook (with_kwargs=True) for guard(module): the whole tree against the inputs."""
    return _ForwardGuard()


def layer_hook(name: str, type: str) -> Callable[..., None]:  # noqa: A002 - the compiled module's keyword
    """A new forward pre-hook (with_kwargs=True) for one layer under guard(module, deep=True)."""
    return _LayerGuard(name, type)


def run_traced(fn: Callable[[Any, Any, Any], Any], module: Any, args: Any, kwargs: Any) -> Any:
    """fn(module, args, kwargs) as a check run while torch.compile traces: guard(deep=True) keeps its record of the
    traced call apart from the eager one."""
    before = _is_tracing()
    _tracing.on = True
    try:
        return fn(module, args, kwargs)
    finally:
        _tracing.on = before


class _DeepCall:
    """DeepCall: the root (weakly) and, while its forward runs, the ids of the tensors its caller passed (alive
    while that call runs, so an id cannot be reused by an activation); the traced forward's kept apart."""

    def __init__(self, root: Any) -> None:
        self.root_ref: Optional[weakref.ref] = weakref.ref(root)
        self.depth = 0
        self.caller_inputs: set[int] = set()
        self.traced_in_root = False
        self.traced_caller_inputs: set[int] = set()


_MAX_REMEMBERED = 64  # a report needs the caller's tensors, not a bound on calls


class DeepGuard:
    """guard(module, deep=True): the root's view of its tree and of the call in progress."""

    def __init__(self, root: Any) -> None:
        self._call = _DeepCall(root)
        self._tree: Optional[list[tuple[str, Any]]] = None  # (qualified name, weak reference), in walk order

    def enter(self, module: Any, args: Any, kwargs: Any) -> bool:
        """The root's forward begins: remembers the caller's tensors; True when the tree changed."""
        call = self._call
        tracing = _is_tracing()
        if tracing or call.depth == 0:
            call.traced_in_root = tracing
            remembered: list[tuple[str, Any]] = []
            seen: set[int] = set()
            with torch._C.DisableTorchFunctionSubclass():
                if args is not None:
                    _input_tensors(args, "", seen, False, remembered)
                if kwargs is not None and not (isinstance(kwargs, dict) and not kwargs):
                    _input_tensors(kwargs, "", seen, False, remembered)
            ids = {id(t) for _, t in remembered[:_MAX_REMEMBERED]}
            if tracing:
                call.traced_caller_inputs = ids
            else:
                call.caller_inputs = ids
        if not tracing:
            call.depth += 1
        tree = self._walk_tree(module)
        if self._tree is not None and len(tree) == len(self._tree) and all(
                name == old_name and old_ref() is obj for (name, obj), (old_name, old_ref) in zip(tree, self._tree)):
            return False
        self._tree = [(name, weakref.ref(obj)) for name, obj in tree]
        return True

    @staticmethod
    def _walk_tree(root: Any) -> list[tuple[str, Any]]:
        """Every submodule, parameter and buffer of the tree with its qualified name: what the C++ snapshot's dict
        watchers see change (a submodule added or replaced, a tensor object added or replaced)."""
        out: list[tuple[str, Any]] = []
        seen: set[int] = set()
        stack: list[tuple[Any, str, int]] = [(root, "", 0)]
        while stack:
            mod, prefix, depth = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            if depth > MAX_NESTING:
                raise _too_deep("the module tree (submodules inside submodules)",
                                "Check a part of it (assert_same_device(model.sub), guard(model.sub)), or flatten "
                                "the chain into an nn.Sequential or nn.ModuleList.")
            out.append((prefix, mod))
            parameters, buffers, children = _module_dicts(mod)
            for tensors in (parameters, buffers):
                for key, value in (tensors or {}).items():
                    if value is not None:
                        out.append((prefix + "." + str(key), value))
            pending = [(child, prefix + "." + str(key), depth + 1) for key, child in (children or {}).items()
                       if child is not None]
            stack.extend(reversed(pending))
        return out

    def leave(self) -> None:
        """The root's forward ended (normally or by an exception)."""
        call = self._call
        if _is_tracing():
            call.traced_in_root = False
            call.traced_caller_inputs = set()
        elif call.depth > 0:
            call.depth -= 1
            if call.depth == 0:
                call.caller_inputs = set()

    def layer_hook(self, name: str, type: str) -> Callable[..., None]:  # noqa: A002
        """A forward pre-hook (with_kwargs=True) for one layer, sharing this guard's view of the model."""
        return _LayerGuard(name, type, self._call)
