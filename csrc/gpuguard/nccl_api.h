// The subset of NCCL gpuguard calls, declared here so that the build never needs nccl.h.
// tests/cpp/test_nccl_api_matches_nccl_h.cc checks every declaration against the real nccl.h at compile time.
#pragma once

#include <cstddef>

namespace gpuguard::nccl {

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
struct ncclComm;
using ncclComm_t = ncclComm*;
constexpr std::size_t kUniqueIdBytes = 128;
struct ncclUniqueId {
  char internal[kUniqueIdBytes];
};
enum ncclDataType_t : int { ncclFloat32 = 7 };
enum ncclRedOp_t : int { ncclSum = 0 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;

// The communicator configuration as NCCL 2.14 defined it, the first version with ncclCommInitRankConfig and
// non-blocking init. NCCL reads `size` bytes of it and fills every later field with its default, so this
// prefix works with every NCCL since 2.14 (the compile-time check proves the offsets match nccl.h).
struct ncclConfigV21400 {
  std::size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
};
constexpr unsigned int kConfigMagic = 0xcafebeef;
constexpr unsigned int kConfigVersion21400 = 21400;  // NCCL_VERSION(2, 14, 0)
constexpr int kConfigUndefInt = -2147483647 - 1;     // NCCL_CONFIG_UNDEF_INT (INT_MIN)

// X(symbol, return type, parameter list).
#define GPUGUARD_NCCL_REQUIRED_FUNCTIONS(X)                        \
  X(ncclGetVersion, ncclResult_t, (int* version))                  \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId * unique_id))     \
  X(ncclGetErrorString, const char*, (ncclResult_t result))

// Present in every NCCL gpuguard can probe with (2.14+); looked up one by one so an older NCCL still
// reports its version and says what it lacks.
#define GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(X)                                                                  \
  X(ncclCommInitRankConfig, ncclResult_t,                                                                   \
    (ncclComm_t * comm, int nranks, ncclUniqueId comm_id, int rank, ncclConfigV21400* config))              \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t * async_error))                    \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t comm))                                                         \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t comm))                                                       \
  X(ncclGetLastError, const char*, (ncclComm_t comm))                                                       \
  X(ncclAllReduce, ncclResult_t,                                                                            \
    (const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, ncclRedOp_t op,       \
     ncclComm_t comm, cudaStream_t stream))

#define GPUGUARD_NCCL_DECLARE_PFN(symbol, ret, params) using PFN_##symbol = ret(*) params;
GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_NCCL_DECLARE_PFN)
GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_NCCL_DECLARE_PFN)
#undef GPUGUARD_NCCL_DECLARE_PFN

}  // namespace gpuguard::nccl
