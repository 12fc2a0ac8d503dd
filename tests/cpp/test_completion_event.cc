// CompletionEvent and the fake driver's streams: work enqueued with gpuguardFakeStreamEnqueue stands in for a kernel.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <tuple>

#include "gpuguard/completion_event.h"
#include "gpuguard/cuda_driver.h"

namespace {

using gpuguard::CompletionEvent;
using gpuguard::CudaDriver;
namespace cu = gpuguard::cu;
using namespace std::chrono_literals;

// A kernel that runs until the test lets it finish (or forever). Freed by the driver's release callback once
// complete; one that never completes is never freed, as the driver may poll it until the process exits.
struct Kernel {
  std::atomic<bool> finish{false};
};
int poll_kernel(void* ctx) { return static_cast<Kernel*>(ctx)->finish ? 1 : 0; }
void release_kernel(void* ctx) { delete static_cast<Kernel*>(ctx); }

using Enqueue = int (*)(void* stream, int (*poll)(void*), void* ctx, void (*release)(void*));
Enqueue fake_enqueue() {
  void* lib = dlopen(std::getenv("GPUGUARD_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  return lib == nullptr ? nullptr : reinterpret_cast<Enqueue>(dlsym(lib, "gpuguardFakeStreamEnqueue"));
}

// Polls done() until it is true or `limit` passes; the event's result at the end.
bool done_within(const CompletionEvent& event, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto done = event.done();
    EXPECT_TRUE(done.ok()) << done.error().message();
    if (!done.ok() || done.value() || std::chrono::steady_clock::now() >= end) return done.ok() && done.value();
    std::this_thread::sleep_for(1ms);
  }
}

class CompletionEventTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& driver = CudaDriver::instance();
    auto st = driver.init();
    ASSERT_TRUE(st.ok()) << st.error().message();
    const auto& fn = driver.fn();
    ASSERT_EQ(fn.cuDevicePrimaryCtxRetain(&context_, 0), cu::CUDA_SUCCESS);
    ASSERT_EQ(fn.cuCtxSetCurrent(context_), cu::CUDA_SUCCESS);
    ASSERT_EQ(fn.cuStreamCreate(&stream_, 0), cu::CUDA_SUCCESS);
    enqueue_ = fake_enqueue();
    ASSERT_NE(enqueue_, nullptr) << "GPUGUARD_LIBCUDA must name the fake driver";
  }
  void TearDown() override {
    if (stream_ != nullptr) CudaDriver::instance().fn().cuStreamDestroy_v2(stream_);
  }

  Kernel* launch(cu::CUstream stream) {
    auto* kernel = new Kernel();
    EXPECT_EQ(enqueue_(stream, poll_kernel, kernel, release_kernel), 0);
    return kernel;
  }
  std::uintptr_t handle() const { return reinterpret_cast<std::uintptr_t>(stream_); }

  cu::CUcontext context_ = nullptr;
  cu::CUstream stream_ = nullptr;
  Enqueue enqueue_ = nullptr;
};

TEST_F(CompletionEventTest, NotDoneWhileTheWorkBeforeItIsPendingThenDone) {
  Kernel* kernel = launch(stream_);
  auto event = CompletionEvent::record(handle());
  ASSERT_TRUE(event.ok()) << event.error().message();
  EXPECT_FALSE(done_within(event.value(), 50ms));
  kernel->finish = true;
  EXPECT_TRUE(done_within(event.value(), 5000ms));
}

TEST_F(CompletionEventTest, AnEventOnAnIdleStreamIsDoneAtOnce) {
  auto event = CompletionEvent::record(handle());
  ASSERT_TRUE(event.ok()) << event.error().message();
  auto done = event.value().done();
  ASSERT_TRUE(done.ok()) << done.error().message();
  EXPECT_TRUE(done.value());
}

TEST_F(CompletionEventTest, NeverCompletingWorkKeepsItNotDoneButNotAnEventRecordedBeforeIt) {
  // on GPU 1, so that the other tests' context (GPU 0) can still synchronise
  const auto& fn = CudaDriver::instance().fn();
  cu::CUcontext hung_context = nullptr;
  cu::CUstream hung_stream = nullptr;
  ASSERT_EQ(fn.cuDevicePrimaryCtxRetain(&hung_context, 1), cu::CUDA_SUCCESS);
  ASSERT_EQ(fn.cuCtxSetCurrent(hung_context), cu::CUDA_SUCCESS);
  ASSERT_EQ(fn.cuStreamCreate(&hung_stream, 0), cu::CUDA_SUCCESS);
  auto before = CompletionEvent::record(reinterpret_cast<std::uintptr_t>(hung_stream));
  ASSERT_TRUE(before.ok()) << before.error().message();
  launch(hung_stream);  // never finishes
  auto after = CompletionEvent::record(reinterpret_cast<std::uintptr_t>(hung_stream));
  ASSERT_TRUE(after.ok()) << after.error().message();
  ASSERT_EQ(fn.cuCtxSetCurrent(context_), cu::CUDA_SUCCESS);  // done() switches to the event's context itself
  EXPECT_FALSE(done_within(after.value(), 300ms));
  EXPECT_TRUE(done_within(before.value(), 1000ms));
  EXPECT_EQ(fn.cuStreamQuery(hung_stream), cu::CUDA_ERROR_NOT_READY);
}

TEST_F(CompletionEventTest, TheLegacyDefaultStreamIsHandleZero) {
  Kernel* kernel = launch(nullptr);
  auto on_default = CompletionEvent::record(0);
  ASSERT_TRUE(on_default.ok()) << on_default.error().message();
  auto on_other = CompletionEvent::record(handle());
  ASSERT_TRUE(on_other.ok()) << on_other.error().message();
  EXPECT_FALSE(done_within(on_default.value(), 50ms));
  EXPECT_TRUE(done_within(on_other.value(), 1000ms));  // another stream's work does not hold it
  kernel->finish = true;
  EXPECT_TRUE(done_within(on_default.value(), 5000ms));
}

TEST_F(CompletionEventTest, AnotherThreadWithNoContextOfItsOwnCanAsk) {
  Kernel* kernel = launch(stream_);
  auto event = CompletionEvent::record(handle());
  ASSERT_TRUE(event.ok()) << event.error().message();
  const CompletionEvent& marked = event.value();
  std::promise<void> first_answer;
  std::promise<void> finished;
  auto asked = std::async(std::launch::async, [&] {
    auto pending = marked.done();
    first_answer.set_value();
    finished.get_future().wait();
    bool done = done_within(marked, 5000ms);
    cu::CUcontext after = reinterpret_cast<cu::CUcontext>(1);
    CudaDriver::instance().fn().cuCtxGetCurrent(&after);
    return std::make_tuple(pending.ok() && !pending.value(), done, after == nullptr);
  });
  first_answer.get_future().wait();
  kernel->finish = true;
  finished.set_value();
  auto [was_pending, became_done, context_put_back] = asked.get();
  EXPECT_TRUE(was_pending);
  EXPECT_TRUE(became_done);
  EXPECT_TRUE(context_put_back) << "done() left the recorded context current on the asking thread";
}

TEST_F(CompletionEventTest, AThreadWithoutAContextCannotRecordAndIsTold) {
  auto message = std::async(std::launch::async, [] {
    auto event = CompletionEvent::record(0);
    return event.ok() ? std::string("recorded") : event.error().message();
  }).get();
  EXPECT_NE(message.find("no CUDA context is current on this thread"), std::string::npos) << message;
}

TEST_F(CompletionEventTest, AnInvalidStreamIsTheDriversErrorNamed) {
  auto event = CompletionEvent::record(0xdead0);
  ASSERT_FALSE(event.ok());
  EXPECT_NE(event.error().message().find("cuEventRecord failed: CUDA_ERROR_INVALID_HANDLE (400)"), std::string::npos)
      << event.error().message();
}

// The fake driver's own contract, which the fake NCCL and CompletionEvent rely on.
TEST_F(CompletionEventTest, FakeStreamSynchronizeAndCtxSynchronizeWaitForTheWork) {
  const auto& fn = CudaDriver::instance().fn();
  Kernel* kernel = launch(stream_);
  EXPECT_EQ(fn.cuStreamQuery(stream_), cu::CUDA_ERROR_NOT_READY);
  auto synced = std::async(std::launch::async, [&] {
    fn.cuCtxSetCurrent(context_);
    return fn.cuCtxSynchronize();
  });
  EXPECT_EQ(synced.wait_for(100ms), std::future_status::timeout) << "cuCtxSynchronize returned before the work";
  kernel->finish = true;
  ASSERT_EQ(synced.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(synced.get(), cu::CUDA_SUCCESS);
  EXPECT_EQ(fn.cuStreamQuery(stream_), cu::CUDA_SUCCESS);
  EXPECT_EQ(fn.cuStreamSynchronize(stream_), cu::CUDA_SUCCESS);
}

TEST_F(CompletionEventTest, FakeDestroyedStreamStillFinishesItsWork) {
  const auto& fn = CudaDriver::instance().fn();
  cu::CUstream doomed = nullptr;
  ASSERT_EQ(fn.cuStreamCreate(&doomed, 0), cu::CUDA_SUCCESS);
  Kernel* kernel = launch(doomed);
  auto event = CompletionEvent::record(reinterpret_cast<std::uintptr_t>(doomed));
  ASSERT_TRUE(event.ok()) << event.error().message();
  ASSERT_EQ(fn.cuStreamDestroy_v2(doomed), cu::CUDA_SUCCESS);
  EXPECT_EQ(fn.cuStreamQuery(doomed), static_cast<cu::CUresult>(400));  // the handle is gone
  kernel->finish = true;
  EXPECT_TRUE(done_within(event.value(), 5000ms));
}

// A driver that lacks the event entry points (libgpuguard_fake_cuda_without_events.so).
TEST(CompletionEventWithoutEvents, TheMissingSymbolIsNamed) {
  auto& driver = CudaDriver::instance();
  auto st = driver.init();
  ASSERT_TRUE(st.ok()) << st.error().message();
  cu::CUcontext context = nullptr;
  ASSERT_EQ(driver.fn().cuDevicePrimaryCtxRetain(&context, 0), cu::CUDA_SUCCESS);
  ASSERT_EQ(driver.fn().cuCtxSetCurrent(context), cu::CUDA_SUCCESS);
  auto event = CompletionEvent::record(0);
  ASSERT_FALSE(event.ok());
  EXPECT_NE(event.error().message().find("the driver does not export cuEventCreate"), std::string::npos)
      << event.error().message();
}

TEST(CompletionEventNoDriver, TheLoadErrorIsReturned) {
  auto event = CompletionEvent::record(0);
  ASSERT_FALSE(event.ok());
  EXPECT_NE(event.error().message().find("no-such-libcuda.so"), std::string::npos) << event.error().message();
}

}  // namespace
