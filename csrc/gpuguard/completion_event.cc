// CompletionEvent: cuEventCreate/cuEventRecord in the caller's context, cuEventQuery from any thread.
#include "gpuguard/completion_event.h"

#include <utility>

#include "gpuguard/cuda_driver.h"

namespace gpuguard {

Result<CompletionEvent> CompletionEvent::record(std::uintptr_t stream) {
  // The caller's CUDA is initialised already (it has a stream): load() only, never cuInit on its behalf.
  GPUGUARD_TRY(CudaDriver::instance().load());
  cu::CUcontext context = nullptr;
  GPUGUARD_CU(cuCtxGetCurrent, &context);
  if (context == nullptr) {
    return gpuguard_error("CompletionEvent::record",
                          "no CUDA context is current on this thread, so the stream's work cannot be marked; call it "
                          "on the thread that queued the work, after its device was set (torch.cuda.set_device)",
                          GPUGUARD_WHERE);
  }
  cu::CUevent event = nullptr;
  GPUGUARD_CU(cuEventCreate, &event, cu::CU_EVENT_DISABLE_TIMING);  // no timing: the cheapest event
  CompletionEvent marked(context, event);  // from here on the event is destroyed on every path
  GPUGUARD_CU(cuEventRecord, event, reinterpret_cast<cu::CUstream>(stream));
  return marked;
}

CompletionEvent::CompletionEvent(CompletionEvent&& other) noexcept
    : context_(std::exchange(other.context_, nullptr)), event_(std::exchange(other.event_, nullptr)) {}

CompletionEvent& CompletionEvent::operator=(CompletionEvent&& other) noexcept {
  if (this != &other) {
    destroy();
    context_ = std::exchange(other.context_, nullptr);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CompletionEvent::~CompletionEvent() { destroy(); }

void CompletionEvent::destroy() {
  const auto& fn = CudaDriver::instance().fn();
  if (event_ != nullptr && fn.cuEventDestroy_v2 != nullptr) fn.cuEventDestroy_v2(event_);
  event_ = nullptr;
}

Result<bool> CompletionEvent::done() const {
  if (event_ == nullptr) return gpuguard_error("CompletionEvent::done", "the event was moved from", GPUGUARD_WHERE);
  cu::CUcontext previous = nullptr;
  GPUGUARD_CU(cuCtxGetCurrent, &previous);
  if (previous != context_) GPUGUARD_CU(cuCtxSetCurrent, context_);
  Status queried = CudaDriver::instance().call("cuEventQuery", CudaDriver::instance().fn().cuEventQuery,
                                               GPUGUARD_WHERE, event_);
  if (previous != context_) GPUGUARD_CU(cuCtxSetCurrent, previous);
  if (queried) return true;
  if (queried.error().code == cu::CUDA_ERROR_NOT_READY) return false;  // still pending
  return queried.error();
}

}  // namespace gpuguard
