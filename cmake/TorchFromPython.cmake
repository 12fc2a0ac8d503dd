# Locates the installed torch through Python, not find_package(Torch): the latter demands the CUDA toolkit
# for CUDA builds of torch, which most users do not have, and gpuguard never links CUDA at build time.
# cmake/torch_build_flags.py reads the facts from that torch (and refuses one older than gpuguard supports).
# Sets TORCH_INCLUDE_DIRS, TORCH_LIBRARY_DIRS, TORCH_CXX11_ABI, TORCH_VERSION, TORCH_PYBIND11_DEFINITIONS (the
# pybind11 flags torch <= 2.9 gives its own extensions) and the imported target gpuguard::torch (c10 torch
# torch_cpu) plus gpuguard::torch_python (which carries those pybind11 flags too). The C++ ABI itself is set for
# the whole build by the top-level CMakeLists.txt.

# GPUGUARD_TORCH_DIR (a torch package folder, not installed: scripts/build_wheels.sh's unpacked wheels) reads the
# same facts from its files instead of importing the interpreter's torch.
set(GPUGUARD_TORCH_DIR "" CACHE PATH "Build against the torch package in this folder (its files read, not imported)")
set(_torch_from "")
if(GPUGUARD_TORCH_DIR)
  set(_torch_from --torch-dir "${GPUGUARD_TORCH_DIR}")
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/torch_build_flags.py" --cmake ${_torch_from}
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_lines "${_torch_info}")
foreach(_line IN LISTS _torch_lines)
  if(_line MATCHES "^([A-Z0-9_]+)=(.*)$")
    set(${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
string(REPLACE "|" ";" TORCH_INCLUDE_DIRS "${TORCH_INCLUDE_DIRS}")
string(REPLACE "|" ";" TORCH_LIBRARY_DIRS "${TORCH_LIBRARY_DIRS}")
string(REPLACE "|" ";" TORCH_PYBIND11_DEFINITIONS "${TORCH_PYBIND11_DEFINITIONS}")
if(TORCH_NEWER_THAN_TESTED)
  message(WARNING "${TORCH_NEWER_THAN_TESTED}")
endif()

function(_gpuguard_torch_lib target name)
  find_library(_path_${name} NAMES ${name} PATHS ${TORCH_LIBRARY_DIRS} NO_DEFAULT_PATH REQUIRED)
  add_library(${target} SHARED IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES IMPORTED_LOCATION "${_path_${name}}")
endfunction()
_gpuguard_torch_lib(gpuguard_torch_c10 c10)
_gpuguard_torch_lib(gpuguard_torch_torch torch)
_gpuguard_torch_lib(gpuguard_torch_torch_cpu torch_cpu)
_gpuguard_torch_lib(gpuguard_torch_torch_python torch_python)

add_library(gpuguard_torch INTERFACE)
add_library(gpuguard::torch ALIAS gpuguard_torch)
target_include_directories(gpuguard_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(gpuguard_torch INTERFACE gpuguard_torch_c10 gpuguard_torch_torch gpuguard_torch_torch_cpu)

add_library(gpuguard_torch_py INTERFACE)
add_library(gpuguard::torch_python ALIAS gpuguard_torch_py)
target_link_libraries(gpuguard_torch_py INTERFACE gpuguard_torch gpuguard_torch_torch_python)
target_compile_definitions(gpuguard_torch_py INTERFACE ${TORCH_PYBIND11_DEFINITIONS})

message(STATUS "gpuguard: building against torch ${TORCH_VERSION} (CXX11 ABI ${TORCH_CXX11_ABI})")
