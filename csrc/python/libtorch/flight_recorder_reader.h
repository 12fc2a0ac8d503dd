// gpuguard._libtorch.flight_recorder_reader(): binds the capsule that lets the watchdog read torch's flight recorder.
#pragma once

#include <pybind11/pybind11.h>

namespace gpuguard::python {

void bind_flight_recorder_reader(pybind11::module_& m);

}  // namespace gpuguard::python
