# Locates the installed torch through Python, not find_package(Torch): the latter demands the CUDA toolkit
# for CUDA builds of torch, which most users do not have, and gpuguard never links CUDA at build time.
# Sets TORCH_INCLUDE_DIRS, TORCH_LIBRARY_DIRS, TORCH_CXX11_ABI, TORCH_VERSION and the imported target
# gpuguard::torch (c10 torch torch_cpu) plus gpuguard::torch_python.

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
"import torch, torch.utils.cpp_extension as ce
print('|'.join(ce.include_paths()))
print('|'.join(ce.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR
    "gpuguard builds against the installed PyTorch, but '${Python_EXECUTABLE} -c \"import torch\"' failed:\n"
    "${_torch_err}\nInstall torch first, then build with: pip install --no-build-isolation .")
endif()
string(REPLACE "\n" ";" _torch_lines "${_torch_info}")
list(GET _torch_lines 0 _inc)
list(GET _torch_lines 1 _lib)
list(GET _torch_lines 2 TORCH_CXX11_ABI)
list(GET _torch_lines 3 TORCH_VERSION)
string(REPLACE "|" ";" TORCH_INCLUDE_DIRS "${_inc}")
string(REPLACE "|" ";" TORCH_LIBRARY_DIRS "${_lib}")

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
target_compile_definitions(gpuguard_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})

add_library(gpuguard_torch_py INTERFACE)
add_library(gpuguard::torch_python ALIAS gpuguard_torch_py)
target_link_libraries(gpuguard_torch_py INTERFACE gpuguard_torch gpuguard_torch_torch_python)

message(STATUS "gpuguard: building against torch ${TORCH_VERSION} (CXX11 ABI ${TORCH_CXX11_ABI})")
