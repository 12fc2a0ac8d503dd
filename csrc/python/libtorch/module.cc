// gpuguard._libtorch: the tensor checks (assert_same_device, guard()'s hooks, DeepGuard) over LibTorch, and the
// flight recorder reader the watchdog uses.
//
// The one module that links torch; built with torch's own pybind11, so that at::Tensor and torch.device cross the
// boundary with torch's casters. gpuguard._libtorch_loader imports torch first and checks the version it was
// built for, so that a torch upgrade breaks these checks alone, with a message that says so.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "collect_tensors.h"
#include "device_check.h"
#include "flight_recorder_reader.h"
#include "gpuguard/tensor_devices.h"

namespace py = pybind11;

namespace {

void bind_tensor_devices(py::module_& m) {
  namespace gp = gpuguard::python;
  m.def("check_call", &gp::check_call, py::arg("module"), py::arg("args"), py::arg("kwargs"),
        py::arg("expected"), py::arg("labels"),
        "The common torch.device of a module's parameters and buffers (module may be None) and every tensor in "
        "args/kwargs; None when there is none. Raises gpuguard.DeviceMismatchError.");
  m.def("checks_disabled", &gp::checks_disabled, "Whether GPUGUARD_DISABLE turns every check off.");
  m.def("_reads_devices_in_one_scan", &gp::device_scan_usable,
        "Whether guard()'s per-forward check reads every tensor's device in one scan of this torch's TensorImpls "
        "(else it calls device() on each: the same answers, more slowly).");
  m.def("compress_names", &gpuguard::compress_names, py::arg("names"), py::arg("universe"),
        "Qualified names with whole subtrees and index runs compressed (layers.0-15.*).");
  m.def("forward_hook", &gp::make_forward_hook,
        "A new forward pre-hook (with_kwargs=True) for guard(module): the whole tree against the inputs.");
  m.def("layer_hook", &gp::make_layer_hook, py::arg("name"), py::arg("type"),
        "A new forward pre-hook (with_kwargs=True) for one layer under guard(module, deep=True).");
  m.def("run_traced", &gp::run_traced, py::arg("fn"), py::arg("module"), py::arg("args"), py::arg("kwargs"),
        "fn(module, args, kwargs) as a check run while torch.compile traces (guard(deep=True) keeps its record "
        "of the traced call apart from the eager one).");
  py::class_<gp::DeepGuard>(m, "DeepGuard",
                            "guard(module, deep=True): the root's view of its tree and of the call in progress.")
      .def(py::init<py::handle>(), py::arg("root"))
      .def("enter", &gp::DeepGuard::enter, py::arg("module"), py::arg("args"), py::arg("kwargs"),
           "The root's forward begins: remembers the caller's tensors; True when the tree changed.")
      .def("leave", &gp::DeepGuard::leave, "The root's forward ended (normally or by an exception).")
      .def("layer_hook", &gp::DeepGuard::layer_hook, py::arg("name"), py::arg("type"),
           "A forward pre-hook (with_kwargs=True) for one layer, sharing this guard's view of the model.");
}

}  // namespace

PYBIND11_MODULE(_libtorch, m) {
  m.doc() = "gpuguard's tensor checks over LibTorch (private; use the gpuguard package)";
  bind_tensor_devices(m);
  gpuguard::python::bind_flight_recorder_reader(m);
}
