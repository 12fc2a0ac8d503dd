// The device check as Python calls it: assert_same_device, the forward pre-hooks behind guard(), and
// raising gpuguard.DeviceMismatchError with the report. Glue over collect_tensors and gpuguard/tensor_devices.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "collect_tensors.h"

namespace gpuguard::python {

namespace py = pybind11;

// GPUGUARD_DISABLE set to anything but "" or "0": every check is a no-op. Read on every call (os.environ
// writes reach the C environment), so it can be switched in a running process.
bool checks_disabled();

// assert_same_device / @same_device: the module's parameters and buffers (module may be None) and every
// tensor inside `args` and `kwargs` (kwargs may be None). `labels`, called with the number of positional
// arguments only when a report is written, names them (None: "args[i]"). Returns the common torch.device,
// None when there is no tensor at all; raises DeviceMismatchError.
py::object check_call(py::handle module, py::handle args, py::handle kwargs, std::optional<c10::Device> expected,
                      py::handle labels);

// guard(module): a forward pre-hook (with_kwargs=True) checking every parameter and buffer of the tree and
// the call's inputs on every forward, from a snapshot of the tree that is rebuilt whenever it changes.
class ForwardGuard {
 public:
  py::object operator()(py::handle module, py::handle args, py::handle kwargs);

 private:
  ModuleSnapshot snapshot_;
};

// guard(module, deep=True): the pre-hook of one layer. Checks the layer's own parameters and buffers (read
// afresh on every call: a layer has a handful) against its inputs, naming the layer in the report.
class LayerGuard {
 public:
  LayerGuard(std::string name, std::string type) : name_(std::move(name)), type_(std::move(type)) {}
  py::object operator()(py::handle module, py::handle args, py::handle kwargs);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::string type_;
};

// The hooks as plain built-in functions (METH_FASTCALL) owning their guard. PyTorch calls a pre-hook as
// hook(module, args, kwargs) on every forward; a built-in skips the bound-method and argument-conversion
// layers a pybind11 object's __call__ goes through, which is most of what a hook costs beyond its check.
py::object make_forward_hook();
py::object make_layer_hook(std::string name, std::string type);

// guard(module, deep=True): tells the root's pre-hook whether the module tree changed since the layers
// were hooked (a submodule added or replaced, a parameter added...), so that it hooks them again.
class TreeWatch {
 public:
  // true (and remembers the new tree) when the tree differs from the one seen last.
  bool changed(py::handle module);

 private:
  ModuleSnapshot snapshot_;
};

}  // namespace gpuguard::python
