// Verified GPU-to-GPU copies through the run-time-loaded driver (see p2p_probe.h for why).
#include "gpuguard/p2p_probe.h"

#include <chrono>
#include <vector>

#include "gpuguard/cuda_driver.h"

namespace gpuguard {

namespace {

// cuda.h's CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: enabling twice (a second probe in one process) is fine.
constexpr int kPeerAccessAlreadyEnabled = 704;

// A retained primary context, released on every path out of the probe.
class PrimaryContext {
 public:
  PrimaryContext(const CudaDriver::Functions& fn, cu::CUdevice device) : fn_(fn), device_(device) {}
  ~PrimaryContext() {
    if (context_ != nullptr && fn_.cuDevicePrimaryCtxRelease_v2 != nullptr) fn_.cuDevicePrimaryCtxRelease_v2(device_);
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  cu::CUcontext* out() { return &context_; }
  cu::CUcontext get() const { return context_; }

 private:
  const CudaDriver::Functions& fn_;
  cu::CUdevice device_;
  cu::CUcontext context_ = nullptr;
};

// Device memory freed (in its own context) on every path out of the probe.
class DeviceBuffer {
 public:
  DeviceBuffer(const CudaDriver::Functions& fn, cu::CUcontext context) : fn_(fn), context_(context) {}
  ~DeviceBuffer() {
    if (pointer_ != 0 && fn_.cuMemFree_v2 != nullptr) {
      if (fn_.cuCtxSetCurrent != nullptr) fn_.cuCtxSetCurrent(context_);
      fn_.cuMemFree_v2(pointer_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cu::CUdeviceptr* out() { return &pointer_; }
  cu::CUdeviceptr get() const { return pointer_; }

 private:
  const CudaDriver::Functions& fn_;
  cu::CUcontext context_;
  cu::CUdeviceptr pointer_ = 0;
};

}  // namespace

unsigned char peer_copy_pattern(int src, int dst, std::size_t offset) {
  return static_cast<unsigned char>((offset * 131u + static_cast<std::size_t>(src) * 17u +
                                     static_cast<std::size_t>(dst) * 29u + 7u) & 0xffu);
}

unsigned char peer_copy_filler(int src, int dst, std::size_t offset) {
  return static_cast<unsigned char>(peer_copy_pattern(src, dst, offset) ^ 0xffu);
}

Result<PeerCopyResult> peer_copy_probe(int src, int dst, std::size_t bytes) {
  auto& driver = CudaDriver::instance();
  GPUGUARD_TRY(driver.init());
  if (src == dst) return gpuguard_error("peer_copy_probe", "source and destination are the same device", GPUGUARD_WHERE);
  if (bytes == 0) return gpuguard_error("peer_copy_probe", "a peer copy of 0 bytes verifies nothing", GPUGUARD_WHERE);
  const auto& fn = driver.fn();
  PeerCopyResult result;
  result.src = src;
  result.dst = dst;
  result.bytes = bytes;

  cu::CUdevice src_dev = 0, dst_dev = 0;
  GPUGUARD_CU(cuDeviceGet, &src_dev, src);
  GPUGUARD_CU(cuDeviceGet, &dst_dev, dst);
  int src_to_dst = 0, dst_to_src = 0;
  GPUGUARD_CU(cuDeviceCanAccessPeer, &src_to_dst, src_dev, dst_dev);
  GPUGUARD_CU(cuDeviceCanAccessPeer, &dst_to_src, dst_dev, src_dev);
  result.peer_access_reported = src_to_dst != 0;

  PrimaryContext src_ctx(fn, src_dev), dst_ctx(fn, dst_dev);
  GPUGUARD_CU(cuDevicePrimaryCtxRetain, src_ctx.out(), src_dev);
  GPUGUARD_CU(cuDevicePrimaryCtxRetain, dst_ctx.out(), dst_dev);

  // Enable peer access where the driver offers it, so that the copy is a real peer write and not a copy
  // staged through host memory (which is what cuMemcpyPeer silently does otherwise).
  auto enable = [&](cu::CUcontext from, cu::CUcontext to) -> Status {
    GPUGUARD_CU(cuCtxSetCurrent, from);
    Status enabled = driver.call("cuCtxEnablePeerAccess", fn.cuCtxEnablePeerAccess, GPUGUARD_WHERE, to, 0u);
    if (!enabled && enabled.error().code != kPeerAccessAlreadyEnabled) return enabled;
    return ok_status();
  };
  if (src_to_dst) {
    GPUGUARD_TRY(enable(src_ctx.get(), dst_ctx.get()));
    result.peer_access_enabled = true;
  }
  if (dst_to_src) GPUGUARD_TRY(enable(dst_ctx.get(), src_ctx.get()));

  std::vector<unsigned char> pattern(bytes), filler(bytes), readback(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    pattern[i] = peer_copy_pattern(src, dst, i);
    filler[i] = peer_copy_filler(src, dst, i);
  }

  DeviceBuffer src_buf(fn, src_ctx.get()), dst_buf(fn, dst_ctx.get());
  GPUGUARD_CU(cuCtxSetCurrent, src_ctx.get());
  GPUGUARD_CU(cuMemAlloc_v2, src_buf.out(), bytes);
  GPUGUARD_CU(cuMemcpyHtoD_v2, src_buf.get(), pattern.data(), bytes);
  GPUGUARD_CU(cuCtxSetCurrent, dst_ctx.get());
  GPUGUARD_CU(cuMemAlloc_v2, dst_buf.out(), bytes);
  GPUGUARD_CU(cuMemcpyHtoD_v2, dst_buf.get(), filler.data(), bytes);
  GPUGUARD_CU(cuCtxSynchronize);

  auto start = std::chrono::steady_clock::now();
  GPUGUARD_CU(cuMemcpyPeer, dst_buf.get(), dst_ctx.get(), src_buf.get(), src_ctx.get(), bytes);
  GPUGUARD_CU(cuCtxSynchronize);
  GPUGUARD_CU(cuCtxSetCurrent, src_ctx.get());
  GPUGUARD_CU(cuCtxSynchronize);
  result.copy_milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  GPUGUARD_CU(cuCtxSetCurrent, dst_ctx.get());
  GPUGUARD_CU(cuMemcpyDtoH_v2, readback.data(), dst_buf.get(), bytes);

  bool unchanged = true;
  for (std::size_t i = 0; i < bytes; ++i) {
    if (readback[i] != pattern[i]) {
      if (result.mismatched_bytes == 0) result.first_mismatch = i;
      ++result.mismatched_bytes;
    }
    unchanged = unchanged && readback[i] == filler[i];
  }
  result.verified = result.mismatched_bytes == 0;
  result.destination_unchanged = unchanged;
  return result;
}

}  // namespace gpuguard
