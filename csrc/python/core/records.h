// bind_records: registers the record classes of gpuguard._core (ErrorInfo, Device, IdentityRecord, ...).
#pragma once

#include <pybind11/pybind11.h>

namespace gpuguard::python {

// Binds every record that crosses the boundary; call first, before any function that returns one.
void bind_records(pybind11::module_& m);

}  // namespace gpuguard::python
