// The device check as Python calls it: assert_same_device, the forward pre-hooks behind guard(), and
// raising gpuguard.DeviceMismatchError with the report. Glue over collect_tensors and gpuguard/tensor_devices.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// guard(module, deep=True): what the root's hooks share with every layer's hook: the root (weakly, for the
// rest of the model's placement in a report) and, while the root's forward runs, which tensors its caller
// passed, so that a layer's report tells an input the caller placed from an activation the model made.
struct DeepCall {
  DeepCall() = default;
  DeepCall(const DeepCall&) = delete;
  DeepCall& operator=(const DeepCall&) = delete;
  ~DeepCall();  // the GIL must be held (it drops a weak reference)

  PyObject* root_ref = nullptr;  // weak reference to the guarded module
  int depth = 0;                 // root forwards in progress (a root called inside its own forward nests)
  // the TensorImpls of the outermost call's tensor inputs (bounded): alive while that call runs, so an
  // address here cannot be reused by an activation
  std::vector<const c10::TensorImpl*> caller_inputs;
  // The same for the forward torch.compile is tracing, kept apart from the eager record: a trace that stops
  // half-way (an error, Dynamo restarting its analysis) never ends with leave(), and must not leave the eager
  // forwards believing they are nested. The next traced forward of the root starts afresh.
  bool traced_in_root = false;
  std::vector<const c10::TensorImpl*> traced_caller_inputs;
};

// fn(module, args, kwargs) as a check run while torch.compile traces (python/gpuguard/tensors/traced_checks.py), on the
// tensors Dynamo traces with; guard(deep=True)'s DeepGuard then keeps its record of the root's call apart from
// the eager one. Returns fn's result.
py::object run_traced(py::handle fn, py::handle module, py::handle args, py::handle kwargs);

// guard(module, deep=True): the pre-hook of one layer. Checks the layer's own parameters and buffers (read
// afresh on every call: a layer has a handful) against its inputs, naming the layer in the report.
class LayerGuard {
 public:
  LayerGuard(std::string name, std::string type, std::shared_ptr<DeepCall> call = nullptr)
      : name_(std::move(name)), type_(std::move(type)), call_(std::move(call)) {}
  py::object operator()(py::handle module, py::handle args, py::handle kwargs);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::string type_;
  std::shared_ptr<DeepCall> call_;  // null: a layer hook on its own, the model around it unknown
};

// The hooks as plain built-in functions (METH_FASTCALL) owning their guard. PyTorch calls a pre-hook as
// hook(module, args, kwargs) on every forward; a built-in skips the bound-method and argument-conversion
// layers a pybind11 object's __call__ goes through, which is most of what a hook costs beyond its check.
py::object make_forward_hook();
py::object make_layer_hook(std::string name, std::string type);

// guard(module, deep=True): the state behind the root's pre-hook and post-hook (tensor_devices._DeepGuard).
// Tells whether the module tree changed since the layers were hooked (a submodule added or replaced, a
// parameter added...), so that they are hooked again, and makes the layers' hooks, which share its DeepCall.
class DeepGuard {
 public:
  explicit DeepGuard(py::handle root);
  // The root's forward begins: remembers its caller's tensors; true (and remembers the new tree) when the
  // tree differs from the one seen last.
  bool enter(py::handle module, py::handle args, py::handle kwargs);
  // The root's forward ended, normally or by an exception (an always-call forward hook).
  void leave();
  // A pre-hook for one layer (with_kwargs=True) sharing this guard's view of the model and its call.
  py::object layer_hook(std::string name, std::string type);

 private:
  ModuleSnapshot snapshot_;
  std::shared_ptr<DeepCall> call_;
};

}  // namespace gpuguard::python
