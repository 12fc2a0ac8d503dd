// gpuguard._core.Watchdog: the collective watchdog (gpuguard/watchdog.h) with a Python stack dumper that needs no GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace gpuguard::python {

void bind_watchdog(pybind11::module_& m);

}  // namespace gpuguard::python
