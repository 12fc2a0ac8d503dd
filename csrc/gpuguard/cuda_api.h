// The subset of the CUDA driver API gpuguard calls, declared here so that the build never needs cuda.h.
// tests/cpp/test_cuda_api_matches_cuda_h.cc checks every declaration against the real cuda.h at compile time.
#pragma once

#include <cstddef>

namespace gpuguard::cu {

enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NOT_READY = 600,  // cuEventQuery / cuStreamQuery: the work is still pending
};
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUstream_st;
using CUstream = CUstream_st*;  // null: the legacy default stream of the current context
struct CUevent_st;
using CUevent = CUevent_st*;
enum CUevent_flags : unsigned int { CU_EVENT_DEFAULT = 0x0, CU_EVENT_DISABLE_TIMING = 0x2 };
struct CUuuid {
  char bytes[16];
};
enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

// X(symbol, return type, parameter list). The symbol is the exported, versioned name (what cuda.h's
// macros expand to), so dlsym finds the same entry point a program compiled against cuda.h would call.
#define GPUGUARD_CUDA_REQUIRED_FUNCTIONS(X)                                               \
  X(cuGetErrorName, CUresult, (CUresult error, const char** name))                        \
  X(cuGetErrorString, CUresult, (CUresult error, const char** text))                      \
  X(cuInit, CUresult, (unsigned int flags))                                               \
  X(cuDriverGetVersion, CUresult, (int* version))                                         \
  X(cuDeviceGetCount, CUresult, (int* count))                                             \
  X(cuDeviceGet, CUresult, (CUdevice * device, int ordinal))                              \
  X(cuDeviceGetName, CUresult, (char* name, int length, CUdevice device))                 \
  X(cuDeviceGetUuid_v2, CUresult, (CUuuid * uuid, CUdevice device))                       \
  X(cuDeviceTotalMem_v2, CUresult, (size_t * bytes, CUdevice device))                     \
  X(cuDeviceGetAttribute, CUresult, (int* value, CUdevice_attribute attribute, CUdevice device)) \
  X(cuDeviceGetPCIBusId, CUresult, (char* bus_id, int length, CUdevice device))

// Used by diagnostics (peer access, peer copies, which GPUs hold a context of this process) and by completion
// tracking (CompletionEvent: streams and events); a driver lacking them still enumerates, and a call needing one
// names it.
#define GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(X)                                                          \
  X(cuDeviceGetUuid, CUresult, (CUuuid * uuid, CUdevice device))                                    \
  X(cuDeviceCanAccessPeer, CUresult, (int* can_access, CUdevice device, CUdevice peer))             \
  X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice device, unsigned int* flags, int* active))       \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext * context, CUdevice device))                     \
  X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice device))                                      \
  X(cuCtxSetCurrent, CUresult, (CUcontext context))                                                 \
  X(cuCtxSynchronize, CUresult, ())                                                                 \
  X(cuCtxEnablePeerAccess, CUresult, (CUcontext peer, unsigned int flags))                          \
  X(cuMemAlloc_v2, CUresult, (CUdeviceptr * pointer, size_t bytes))                                 \
  X(cuMemFree_v2, CUresult, (CUdeviceptr pointer))                                                  \
  X(cuMemcpyHtoD_v2, CUresult, (CUdeviceptr dst, const void* src, size_t bytes))                    \
  X(cuMemcpyDtoH_v2, CUresult, (void* dst, CUdeviceptr src, size_t bytes))                          \
  X(cuMemcpyPeer, CUresult,                                                                         \
    (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, size_t bytes))  \
  X(cuCtxGetCurrent, CUresult, (CUcontext * context))                                               \
  X(cuStreamCreate, CUresult, (CUstream * stream, unsigned int flags))                              \
  X(cuStreamDestroy_v2, CUresult, (CUstream stream))                                                \
  X(cuStreamQuery, CUresult, (CUstream stream))                                                     \
  X(cuStreamSynchronize, CUresult, (CUstream stream))                                               \
  X(cuEventCreate, CUresult, (CUevent * event, unsigned int flags))                                 \
  X(cuEventRecord, CUresult, (CUevent event, CUstream stream))                                      \
  X(cuEventQuery, CUresult, (CUevent event))                                                        \
  X(cuEventSynchronize, CUresult, (CUevent event))                                                  \
  X(cuEventDestroy_v2, CUresult, (CUevent event))

#define GPUGUARD_CUDA_DECLARE_PFN(symbol, ret, params) using PFN_##symbol = ret(*) params;
GPUGUARD_CUDA_REQUIRED_FUNCTIONS(GPUGUARD_CUDA_DECLARE_PFN)
GPUGUARD_CUDA_OPTIONAL_FUNCTIONS(GPUGUARD_CUDA_DECLARE_PFN)
#undef GPUGUARD_CUDA_DECLARE_PFN

}  // namespace gpuguard::cu
