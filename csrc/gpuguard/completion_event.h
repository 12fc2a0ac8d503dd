// A CUDA event recorded on a stream, whose completion another thread asks about (w.collective(stream=)).
#pragma once

#include <cstdint>

#include "gpuguard/cuda_api.h"
#include "gpuguard/error.h"

namespace gpuguard {

// Marks the work queued on a stream so far, as torch.cuda.Event.record() does: done() turns true once all of it
// has completed on the GPU. A collective call returns when its kernel is enqueued, not when it finishes; this
// is how a watcher learns the difference without blocking the thread that launched it.
class CompletionEvent {
 public:
  // Records an event on `stream` -- a CUstream as an integer, what torch.cuda.Stream.cuda_stream gives; 0 is the
  // legacy default stream -- in the calling thread's current CUDA context. An Error names the call that failed,
  // the driver entry point it lacks, or says that no context is current on this thread.
  static Result<CompletionEvent> record(std::uintptr_t stream);

  CompletionEvent(CompletionEvent&& other) noexcept;
  CompletionEvent& operator=(CompletionEvent&& other) noexcept;
  CompletionEvent(const CompletionEvent&) = delete;
  CompletionEvent& operator=(const CompletionEvent&) = delete;
  ~CompletionEvent();  // cuEventDestroy: the driver releases the event once it completes

  // Whether everything queued on the stream before record() has completed (cuEventQuery; CUDA_ERROR_NOT_READY
  // is false). Never blocks. Any thread may call it: it makes the recorded context current on the calling
  // thread for the query and puts back the one that was current before.
  Result<bool> done() const;

 private:
  CompletionEvent(cu::CUcontext context, cu::CUevent event) : context_(context), event_(event) {}
  void destroy();

  cu::CUcontext context_ = nullptr;
  cu::CUevent event_ = nullptr;
};

}  // namespace gpuguard
