// gpuguard._core.Scanner: explain's log reader as a Python type (scanner.cc), added to the torch-free module.
#pragma once

#include <pybind11/pybind11.h>

namespace gpuguard::python {

// Adds the Scanner type and MIN_KEYWORD_BYTES to `m`.
void add_scanner(pybind11::module_& m);

}  // namespace gpuguard::python
