// The subset of NVML (nvml.h) gpuguard calls, declared here so that the build never needs nvml.h.
// tests/cpp/test_nvml_api_matches_nvml_h.cc checks every declaration against a real nvml.h at compile time.
#pragma once

namespace gpuguard::nvml {

enum nvmlReturn_t : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_UNKNOWN = 999,
};
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;

// nvmlMemory_t (v1): used includes the memory the driver reserves for itself.
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
// nvmlMemory_v2_t: the reserved amount on its own; `version` must be kMemoryV2Version (NVML_STRUCT_VERSION).
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);

// nvmlProcessInfo_t (nvmlProcessInfo_v2_t in nvml.h), what nvmlDeviceGetComputeRunningProcesses_v3 fills in.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes, or kValueNotAvailable
  unsigned int gpuInstanceId;        // 0xFFFFFFFF unless MIG
  unsigned int computeInstanceId;    // 0xFFFFFFFF unless MIG
};
// NVML_VALUE_NOT_AVAILABLE, (-1), as an unsigned long long field holds it.
constexpr unsigned long long kValueNotAvailable = ~0ULL;

// X(symbol, return type, parameter list): the exported, versioned names nvml.h's macros expand to.
#define GPUGUARD_NVML_REQUIRED_FUNCTIONS(X)                                              \
  X(nvmlInit_v2, nvmlReturn_t, ())                                                       \
  X(nvmlErrorString, const char*, (nvmlReturn_t result))                                 \
  X(nvmlDeviceGetHandleByUUID, nvmlReturn_t, (const char* uuid, nvmlDevice_t* device))   \
  X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_t * memory))

// A library lacking these still loads; a call needing one names it.
#define GPUGUARD_NVML_OPTIONAL_FUNCTIONS(X)                                                              \
  X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t,                                              \
    (nvmlDevice_t device, unsigned int* infoCount, nvmlProcessInfo_t* infos))                           \
  X(nvmlDeviceGetHandleByPciBusId_v2, nvmlReturn_t, (const char* pciBusId, nvmlDevice_t* device))       \
  X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_v2_t * memory))          \
  X(nvmlSystemGetDriverVersion, nvmlReturn_t, (char* version, unsigned int length))

#define GPUGUARD_NVML_DECLARE_PFN(symbol, ret, params) using PFN_##symbol = ret(*) params;
GPUGUARD_NVML_REQUIRED_FUNCTIONS(GPUGUARD_NVML_DECLARE_PFN)
GPUGUARD_NVML_OPTIONAL_FUNCTIONS(GPUGUARD_NVML_DECLARE_PFN)
#undef GPUGUARD_NVML_DECLARE_PFN

}  // namespace gpuguard::nvml
