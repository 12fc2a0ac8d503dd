// assert_same_device, guard()'s pre-hooks and the DeviceMismatchError they raise (see device_check.h).
#include "device_check.h"

#include <torch/csrc/autograd/python_variable.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>

namespace gpuguard::python {

namespace {

using LabelsFn = std::function<py::object(Py_ssize_t)>;

// Set while a check runs for torch.compile's tracer (run_traced): read by guard(deep=True)'s record of the call.
thread_local bool t_tracing = false;

// The call's tensors into `agreement`. The argument tuple itself is walked by hand: it cannot be part of a
// reference cycle, and a plain tuple of tensors (the common forward) then needs no visited-set at all.
void call_devices(py::handle args, py::handle kwargs, DeviceAgreement& agreement) {
  AddressSet seen;
  if (args && PyTuple_Check(args.ptr())) {
    const Py_ssize_t n = PyTuple_GET_SIZE(args.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PyTuple_GET_ITEM(args.ptr(), i);
      if (THPVariable_CheckExact(item)) {
        agreement.add(THPVariable_Unpack(item));
      } else {
        input_devices(item, agreement, seen);
      }
    }
  } else if (args && !args.is_none()) {
    input_devices(args.ptr(), agreement, seen);
  }
  if (kwargs && !kwargs.is_none() && !(PyDict_Check(kwargs.ptr()) && PyDict_GET_SIZE(kwargs.ptr()) == 0)) {
    input_devices(kwargs.ptr(), agreement, seen);
  }
}

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

py::dict group_to_dict(const DeviceGroup& g) {
  py::list inputs;
  for (const auto& in : g.inputs) {
    py::dict d;
    d["name"] = in.name;
    d["shape"] = py::cast(in.shape);
    d["dtype"] = in.dtype;
    inputs.append(d);
  }
  py::dict out;
  out["device"] = device_name(g.device);
  out["parameters"] = py::cast(g.parameters);
  out["buffers"] = py::cast(g.buffers);
  out["inputs"] = inputs;
  out["summary"] = py::cast(g.summary);
  return out;
}

[[noreturn]] void raise_mismatch(const DeviceReport& report, const CheckContext& context) {
  py::list groups;
  py::list devices;
  for (const auto& g : report.groups) {
    groups.append(group_to_dict(g));
    devices.append(device_name(g.device));
  }
  py::object cls = py::module_::import("gpuguard.errors").attr("DeviceMismatchError");
  py::object error = cls(report.message, py::arg("fix") = report.fix, py::arg("cause") = report.cause,
                         py::arg("groups") = groups, py::arg("devices") = devices,
                         py::arg("expected") = context.expected ? py::object(py::str(device_name(*context.expected)))
                                                                : py::object(py::none()),
                         py::arg("layer") = context.layer.empty() ? py::object(py::none())
                                                                  : py::object(py::str(context.layer)));
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

// The slow path, taken once the fast check said no: names every tensor, writes the report, raises.
// Returns normally (with the common device) only if the tensors agree by now.
// guard(deep=True): where the rest of the model is and whether the disagreeing input is the caller's, for
// the cause and fix of a layer's report. `entries` are the layer's own tensors and its inputs.
void describe_model_around(const DeepCall& deep, const std::vector<TensorEntry>& entries, CheckContext& context) {
  PyObject* root = deep.root_ref ? PyWeakref_GET_OBJECT(deep.root_ref) : Py_None;
  if (root == Py_None) return;  // the model is gone: the report says what it can without it
  std::optional<c10::Device> layer_device;
  std::vector<const c10::TensorImpl*> own;
  for (const auto& e : entries) {
    if (e.role == TensorRole::kInput || !e.tensor.defined()) continue;
    own.push_back(e.tensor.unsafeGetTensorImpl());
    if (!layer_device && !(e.tensor.device().is_cpu() && e.tensor.dim() == 0)) layer_device = e.tensor.device();
  }
  std::vector<TensorEntry> model;
  named_module_tensors(root, /*recurse=*/true, model);
  // the first parameter (as next(model.parameters()) gives it; the first buffer when there is none) leads
  std::stable_partition(model.begin(), model.end(),
                        [](const TensorEntry& e) { return e.role == TensorRole::kParameter; });
  bool first_seen = false;
  for (const auto& e : model) {
    if (!e.tensor.defined() || (e.tensor.device().is_cpu() && e.tensor.dim() == 0)) continue;
    const c10::Device d = e.tensor.device();
    auto& devices = context.model_devices;
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    if (!first_seen) {
      context.first_parameter = e.name;
      first_seen = true;
    }
    if (layer_device && d == *layer_device &&
        std::find(own.begin(), own.end(), e.tensor.unsafeGetTensorImpl()) == own.end()) {
      ++context.others_on_layer_device;
    }
  }
  // the traced root forward when torch.compile traces one (else the eager one: a block compiled on its own
  // inside an eager root's forward)
  const bool traced = t_tracing && deep.traced_in_root;
  const bool in_root = traced || deep.depth > 0;
  // outside the root's forward the layer was called directly: its inputs are its caller's
  context.input_from_caller = !in_root;
  if (in_root && layer_device) {
    for (const auto& e : entries) {
      if (e.role != TensorRole::kInput || !e.tensor.defined() || e.tensor.device() == *layer_device) continue;
      const auto& in = traced ? deep.traced_caller_inputs : deep.caller_inputs;
      if (std::find(in.begin(), in.end(), e.tensor.unsafeGetTensorImpl()) != in.end()) {
        context.input_from_caller = true;
      }
    }
  }
}

std::optional<c10::Device> report_or_raise(py::handle module, bool recurse, py::handle args, py::handle kwargs,
                                           CheckContext context, const LabelsFn& labels_fn,
                                           const DeepCall* deep = nullptr) {
  std::vector<TensorEntry> entries;
  if (module && !module.is_none()) named_module_tensors(module.ptr(), recurse, entries);
  AddressSet seen;
  if (args && PyTuple_Check(args.ptr())) {
    const Py_ssize_t n = PyTuple_GET_SIZE(args.ptr());
    py::object labels = py::none();
    try {
      labels = labels_fn(n);
    } catch (py::error_already_set&) {
      labels = py::none();  // names are a nicety; the report goes out with args[i]
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      std::string label = "args[" + std::to_string(i) + "]";
      if (py::isinstance<py::list>(labels) && i < static_cast<Py_ssize_t>(py::len(labels))) {
        py::handle l = labels.cast<py::list>()[i];
        if (py::isinstance<py::str>(l)) label = l.cast<std::string>();
      }
      named_input_tensors(PyTuple_GET_ITEM(args.ptr(), i), label, entries, seen);
    }
  }
  if (kwargs && PyDict_Check(kwargs.ptr())) {
    for (auto item : py::reinterpret_borrow<py::dict>(kwargs)) {
      named_input_tensors(item.second.ptr(), py::str(item.first).cast<std::string>(), entries, seen);
    }
  }
  if (deep) describe_model_around(*deep, entries, context);
  DeviceReport report = check_devices(entries, context);
  if (!report.consistent) raise_mismatch(report, context);
  return report.device;
}

py::object device_or_none(std::optional<c10::Device> device) {
  return device ? py::cast(*device) : py::object(py::none());
}

// Names a forward's positional arguments after its signature (tensors/arg_names.py), for the report only.
LabelsFn forward_labels(py::handle module) {
  return [module](Py_ssize_t n) -> py::object {
    return py::module_::import("gpuguard.tensors.arg_names").attr("_forward_arg_names")(module, n);
  };
}

}  // namespace

bool checks_disabled() {
  const char* v = std::getenv("GPUGUARD_DISABLE");
  return v && *v && std::strcmp(v, "0") != 0;
}

py::object check_call(py::handle module, py::handle args, py::handle kwargs, std::optional<c10::Device> expected,
                      py::handle labels) {
  DeviceAgreement agreement(expected);
  const bool has_module = module && !module.is_none();
  if (has_module) {
    if (const ModuleSnapshot* snapshot = cached_snapshot(module.ptr())) {
      snapshot->add_devices(agreement);
    } else {
      module_devices(module.ptr(), /*recurse=*/true, agreement);
    }
  }
  call_devices(args, kwargs, agreement);
  if (agreement.agree()) return device_or_none(agreement.device());

  CheckContext context;
  context.expected = expected;
  if (has_module) context.module = type_name(module);
  LabelsFn labels_fn = [labels](Py_ssize_t n) -> py::object {
    if (!labels || labels.is_none()) return py::none();
    return labels(n);
  };
  return device_or_none(report_or_raise(module, /*recurse=*/true, args, kwargs, context, labels_fn));
}

py::object ForwardGuard::operator()(py::handle module, py::handle args, py::handle kwargs) {
  if (checks_disabled()) return py::none();
  if (!snapshot_.valid_for(module.ptr())) snapshot_.rebuild(module.ptr());
  DeviceAgreement agreement;
  snapshot_.add_devices(agreement);
  call_devices(args, kwargs, agreement);
  if (agreement.agree()) return py::none();

  CheckContext context;
  context.module = type_name(module);
  report_or_raise(module, /*recurse=*/true, args, kwargs, context, forward_labels(module));
  return py::none();
}

py::object LayerGuard::operator()(py::handle module, py::handle args, py::handle kwargs) {
  if (checks_disabled()) return py::none();
  DeviceAgreement agreement;
  module_devices(module.ptr(), /*recurse=*/false, agreement);
  call_devices(args, kwargs, agreement);
  if (agreement.agree()) return py::none();

  CheckContext context;
  context.module = type_name(module);
  context.layer = name_.empty() ? "<root>" : name_;
  context.layer_type = type_;
  report_or_raise(module, /*recurse=*/false, args, kwargs, context, forward_labels(module), call_.get());
  return py::none();
}

namespace {

template <typename Guard>
PyObject* call_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  // PyTorch calls a pre-hook registered with_kwargs=True as hook(module, args, kwargs), and one registered
  // without as hook(module, args); it also calls a hook removed during the forward that runs the hooks with
  // the second form (it iterates a copy of the hooks but reads with_kwargs afresh). Both are checked.
  if (nargs != 3 && nargs != 2) {
    PyErr_Format(PyExc_TypeError,
                 "gpuguard's forward pre-hook takes (module, args, kwargs) or (module, args), got %zd arguments",
                 nargs);
    return nullptr;
  }
  auto* guard = static_cast<Guard*>(PyCapsule_GetPointer(self, nullptr));
  if (!guard) return nullptr;
  try {
    return (*guard)(args[0], args[1], nargs == 3 ? py::handle(args[2]) : py::handle(Py_None)).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

template <typename Guard>
void delete_guard(PyObject* capsule) {
  delete static_cast<Guard*>(PyCapsule_GetPointer(capsule, nullptr));
}

template <typename Guard>
py::object make_hook(Guard* guard, PyMethodDef* def) {
  PyObject* capsule = PyCapsule_New(guard, nullptr, delete_guard<Guard>);
  if (!capsule) {
    delete guard;
    throw py::error_already_set();
  }
  // how tracebacks and Dynamo name it
  static PyObject* module_name = PyUnicode_InternFromString("gpuguard._libtorch");
  PyObject* fn = PyCFunction_NewEx(def, capsule, module_name);  // holds the capsule, the capsule the guard
  Py_DECREF(capsule);
  if (!fn) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

PyMethodDef g_forward_hook_def = {"gpuguard_forward_check", reinterpret_cast<PyCFunction>(
    reinterpret_cast<void (*)()>(call_hook<ForwardGuard>)), METH_FASTCALL,
    "gpuguard.guard(module): checks that the module's parameters, buffers and inputs share one device."};
PyMethodDef g_layer_hook_def = {"gpuguard_layer_check", reinterpret_cast<PyCFunction>(
    reinterpret_cast<void (*)()>(call_hook<LayerGuard>)), METH_FASTCALL,
    "gpuguard.guard(module, deep=True): checks one layer's own weights against its inputs."};

}  // namespace

py::object make_forward_hook() { return make_hook(new ForwardGuard(), &g_forward_hook_def); }

py::object make_layer_hook(std::string name, std::string type) {
  return make_hook(new LayerGuard(std::move(name), std::move(type)), &g_layer_hook_def);
}

DeepCall::~DeepCall() { Py_CLEAR(root_ref); }

DeepGuard::DeepGuard(py::handle root) : call_(std::make_shared<DeepCall>()) {
  call_->root_ref = PyWeakref_NewRef(root.ptr(), nullptr);
  if (!call_->root_ref) throw py::error_already_set();
}

bool DeepGuard::enter(py::handle module, py::handle args, py::handle kwargs) {
  if (t_tracing || call_->depth++ == 0) {
    constexpr std::size_t kMaxRemembered = 64;  // a report needs the caller's tensors, not a bound on calls
    call_->traced_in_root = t_tracing;
    auto& inputs = t_tracing ? call_->traced_caller_inputs : call_->caller_inputs;
    inputs.clear();
    AddressSet seen;
    auto remember = [&](py::handle obj) {
      if (obj && !obj.is_none()) input_tensor_impls(obj.ptr(), inputs, kMaxRemembered, seen);
    };
    remember(args);
    if (kwargs && !kwargs.is_none() && !(PyDict_Check(kwargs.ptr()) && PyDict_GET_SIZE(kwargs.ptr()) == 0)) {
      remember(kwargs);
    }
  }
  if (snapshot_.valid_for(module.ptr())) return false;
  snapshot_.rebuild(module.ptr());
  return true;
}

void DeepGuard::leave() {
  if (t_tracing) {
    call_->traced_in_root = false;
    call_->traced_caller_inputs.clear();
  } else if (call_->depth > 0 && --call_->depth == 0) {
    call_->caller_inputs.clear();
  }
}

py::object run_traced(py::handle fn, py::handle module, py::handle args, py::handle kwargs) {
  struct Tracing {
    bool before = t_tracing;
    Tracing() { t_tracing = true; }
    ~Tracing() { t_tracing = before; }
  } tracing;
  return fn(module, args, kwargs);
}

py::object DeepGuard::layer_hook(std::string name, std::string type) {
  return make_hook(new LayerGuard(std::move(name), std::move(type), call_), &g_layer_hook_def);
}

}  // namespace gpuguard::python
