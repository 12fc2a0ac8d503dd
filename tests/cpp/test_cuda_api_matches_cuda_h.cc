// Compile-time proof that gpuguard's own declarations of the driver API (cuda_api.h) match cuda.h:
// every function pointer type must agree parameter by parameter, so a dlsym'ed pointer is called correctly.
#include <cuda.h>

#include <string_view>
#include <type_traits>

#include "abi_compatible.h"
#include "gpuguard/cuda_api.h"

// Specialisations of gpuguard_test::abi_compatible must sit outside any anonymous namespace.
namespace g = gpuguard::cu;

// A gpuguard type is compatible with a cuda.h type when it is the same type, or a stand-in of the same
// size for an enum/struct/opaque handle, and pointers/const/function types compose that.
using gpuguard_test::abi_compatible;
using gpuguard_test::same_size;
template <>
struct gpuguard_test::abi_compatible<g::CUresult, ::CUresult>
    : std::bool_constant<sizeof(g::CUresult) == sizeof(::CUresult) && std::is_enum_v<::CUresult>> {};
template <>
struct gpuguard_test::abi_compatible<g::CUdevice_attribute, ::CUdevice_attribute>
    : same_size<g::CUdevice_attribute, ::CUdevice_attribute> {};
template <>
struct gpuguard_test::abi_compatible<g::CUuuid, ::CUuuid> : same_size<g::CUuuid, ::CUuuid> {};
template <>
struct gpuguard_test::abi_compatible<g::CUctx_st, ::CUctx_st> : std::true_type {};  // opaque handle
template <>
struct gpuguard_test::abi_compatible<g::CUstream_st, ::CUstream_st> : std::true_type {};  // opaque handle
template <>
struct gpuguard_test::abi_compatible<g::CUevent_st, ::CUevent_st> : std::true_type {};  // opaque handle

static_assert(std::is_same_v<g::CUdevice, ::CUdevice>);
static_assert(std::is_same_v<g::CUdeviceptr, ::CUdeviceptr>);

#define GPUGUARD_CHECK_AGAINST_CUDA_H(sym, ret, params)                                  \
  static_assert(abi_compatible<g::PFN_##sym, decltype(&::sym)>::value,                      \
                "gpuguard's declaration of " #sym " does not match cuda.h");
GPUGUARD_CUDA_REQUIRED_FUNCTIONS(GPUGUARD_CHECK_AGAINST_CUDA_H)
GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(GPUGUARD_CHECK_AGAINST_CUDA_H)

// Attribute numbers are part of the ABI too.
static_assert(g::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID == static_cast<int>(::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID));
static_assert(g::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID == static_cast<int>(::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
static_assert(g::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID == static_cast<int>(::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID));
static_assert(g::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
              static_cast<int>(::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
static_assert(g::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
              static_cast<int>(::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
static_assert(g::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ==
              static_cast<int>(::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
static_assert(g::CUDA_ERROR_NO_DEVICE == static_cast<int>(::CUDA_ERROR_NO_DEVICE));
static_assert(g::CUDA_ERROR_NOT_INITIALIZED == static_cast<int>(::CUDA_ERROR_NOT_INITIALIZED));
static_assert(g::CUDA_ERROR_NOT_READY == static_cast<int>(::CUDA_ERROR_NOT_READY));
static_assert(g::CU_EVENT_DEFAULT == static_cast<unsigned int>(::CU_EVENT_DEFAULT));
static_assert(g::CU_EVENT_DISABLE_TIMING == static_cast<unsigned int>(::CU_EVENT_DISABLE_TIMING));
// The symbols gpuguard dlsym's are those cuda.h's macros expand to (cuStreamDestroy -> cuStreamDestroy_v2; the
// stream calls unsuffixed, as without per-thread default streams, which gpuguard never asks for).
#define GPUGUARD_EXPANDED_NAME(call) GPUGUARD_STRINGIFY(call)
#define GPUGUARD_STRINGIFY(call) #call
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(cuStreamDestroy)) == "cuStreamDestroy_v2");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(cuEventDestroy)) == "cuEventDestroy_v2");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(cuStreamQuery)) == "cuStreamQuery");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(cuStreamSynchronize)) == "cuStreamSynchronize");
static_assert(std::string_view(GPUGUARD_EXPANDED_NAME(cuEventRecord)) == "cuEventRecord");
