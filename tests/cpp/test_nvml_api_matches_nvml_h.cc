// Compile-time proof that gpuguard's own declarations of NVML (nvml_api.h) match nvml.h: every function pointer
// type agrees parameter by parameter, the structs NVML fills in have nvml.h's layout, and the codes its values.
#include <nvml.h>

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "abi_compatible.h"
#include "gpuguard/nvml_api.h"

namespace g = gpuguard::nvml;

using gpuguard_test::abi_compatible;
using gpuguard_test::same_size;
template <>
struct gpuguard_test::abi_compatible<g::nvmlReturn_t, ::nvmlReturn_t>
    : std::bool_constant<sizeof(g::nvmlReturn_t) == sizeof(::nvmlReturn_t) && std::is_enum_v<::nvmlReturn_t>> {};
template <>
struct gpuguard_test::abi_compatible<g::nvmlDevice_st, ::nvmlDevice_st> : std::true_type {};  // opaque handle
template <>
struct gpuguard_test::abi_compatible<g::nvmlMemory_t, ::nvmlMemory_t> : same_size<g::nvmlMemory_t, ::nvmlMemory_t> {};
template <>
struct gpuguard_test::abi_compatible<g::nvmlMemory_v2_t, ::nvmlMemory_v2_t>
    : same_size<g::nvmlMemory_v2_t, ::nvmlMemory_v2_t> {};
template <>
struct gpuguard_test::abi_compatible<g::nvmlProcessInfo_t, ::nvmlProcessInfo_t>
    : same_size<g::nvmlProcessInfo_t, ::nvmlProcessInfo_t> {};

#define GPUGUARD_CHECK_AGAINST_NVML_H(sym, ret, params)                 \
  static_assert(abi_compatible<g::PFN_##sym, decltype(&::sym)>::value, \
                "gpuguard's declaration of " #sym " does not match nvml.h");
GPUGUARD_NVML_REQUIRED_FUNCTIONS(GPUGUARD_CHECK_AGAINST_NVML_H)
GPUGUARD_NVML_OPTIONAL_FUNCTIONS(GPUGUARD_CHECK_AGAINST_NVML_H)

// The fields NVML writes, where nvml.h puts them.
static_assert(offsetof(g::nvmlProcessInfo_t, pid) == offsetof(::nvmlProcessInfo_t, pid));
static_assert(offsetof(g::nvmlProcessInfo_t, usedGpuMemory) == offsetof(::nvmlProcessInfo_t, usedGpuMemory));
static_assert(offsetof(g::nvmlProcessInfo_t, gpuInstanceId) == offsetof(::nvmlProcessInfo_t, gpuInstanceId));
static_assert(offsetof(g::nvmlProcessInfo_t, computeInstanceId) == offsetof(::nvmlProcessInfo_t, computeInstanceId));
static_assert(offsetof(g::nvmlMemory_t, total) == offsetof(::nvmlMemory_t, total));
static_assert(offsetof(g::nvmlMemory_t, free) == offsetof(::nvmlMemory_t, free));
static_assert(offsetof(g::nvmlMemory_t, used) == offsetof(::nvmlMemory_t, used));
static_assert(offsetof(g::nvmlMemory_v2_t, reserved) == offsetof(::nvmlMemory_v2_t, reserved));
static_assert(offsetof(g::nvmlMemory_v2_t, used) == offsetof(::nvmlMemory_v2_t, used));
static_assert(g::kMemoryV2Version == nvmlMemory_v2);
static_assert(g::kValueNotAvailable == static_cast<unsigned long long>(NVML_VALUE_NOT_AVAILABLE));
static_assert(g::NVML_ERROR_NOT_FOUND == static_cast<int>(::NVML_ERROR_NOT_FOUND));
static_assert(g::NVML_ERROR_INSUFFICIENT_SIZE == static_cast<int>(::NVML_ERROR_INSUFFICIENT_SIZE));
static_assert(g::NVML_ERROR_UNINITIALIZED == static_cast<int>(::NVML_ERROR_UNINITIALIZED));
static_assert(g::NVML_ERROR_NO_PERMISSION == static_cast<int>(::NVML_ERROR_NO_PERMISSION));
// The names gpuguard dlsym's are those nvml.h's macros expand to.
#define GPUGUARD_EXPANDED_NAME(call) GPUGUARD_STRINGIFY(call)
#define GPUGUARD_STRINGIFY(call) #call
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(nvmlInit)) == "nvmlInit_v2");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(nvmlDeviceGetComputeRunningProcesses)) ==
              "nvmlDeviceGetComputeRunningProcesses_v3");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(nvmlDeviceGetHandleByPciBusId)) ==
              "nvmlDeviceGetHandleByPciBusId_v2");
