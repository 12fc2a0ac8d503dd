// gpuguard._libtorch.flight_recorder_reader(): torch's flight recorder, read without the GIL, for the torch-free
// watchdog (a C function in a capsule; see csrc/gpuguard/flight_recorder.h).
//
// gloo and any backend FlightRecorderHook records (torch >= 2.15): c10d::dump_fr_trace_json(include_collectives,
// only_active, backend), which reads the status alone in microseconds. NCCL: ProcessGroupNCCL's control-plane
// handler "dump_nccl_trace_json" (libtorch_cuda registers it; asked by name so that _libtorch need not link it).
// Neither takes the GIL: the JSON dump carries no stack traces, whose symbolisation would.
#include "flight_recorder_reader.h"

#include <torch/version.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>

#include "gpuguard/flight_recorder.h"

// torch 2.6's wheel ships no control-plane header (and its NCCL recorder is off by default): no handler calls there.
#if __has_include(<torch/csrc/distributed/c10d/control_plane/Handlers.hpp>)
#include <torch/csrc/distributed/c10d/control_plane/Handlers.hpp>
#define GPUGUARD_HAVE_HANDLERS 1
#endif
// dump_fr_trace_json(include_collectives, only_active, backend): measured on torch 2.15.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#define GPUGUARD_HAVE_FR_BACKENDS 1
#endif

namespace gpuguard::python {
namespace {

#ifdef GPUGUARD_HAVE_HANDLERS
namespace cp = c10d::control_plane;

class HandlerRequest : public cp::Request {
 public:
  explicit HandlerRequest(std::multimap<std::string, std::string> params) : params_(std::move(params)) {}
  const std::string& body() const override { return body_; }
  const std::multimap<std::string, std::string>& params() const override { return params_; }

 private:
  std::string body_;
  std::multimap<std::string, std::string> params_;
};

class HandlerResponse : public cp::Response {
 public:
  void setContent(std::string&& text, const std::string& /*content_type*/) override { content = std::move(text); }
  void setStatus(int s) override { status = s; }
  std::string content;
  int status = 200;
};

bool registered(const std::string& name) {
  auto names = cp::getHandlerNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The control-plane handler `name`, asked as an HTTP client of torch's worker server would ask it.
std::string call_handler(const std::string& name, std::multimap<std::string, std::string> params) {
  if (!registered(name))
    throw std::runtime_error("this torch (" TORCH_VERSION ") registers no control-plane handler '" + name + "'");
  HandlerRequest request(std::move(params));
  HandlerResponse response;
  cp::getHandler(name)(request, response);
  if (response.status != 200)
    throw std::runtime_error("'" + name + "' answered status " + std::to_string(response.status) + ": " +
                             response.content.substr(0, 200));
  return std::move(response.content);
}
#endif

std::string dump(const std::string& source, bool include_collectives) {
  if (source == "nccl") {
#ifdef GPUGUARD_HAVE_HANDLERS
    return call_handler("dump_nccl_trace_json", {{"includecollectives", include_collectives ? "true" : "false"},
                                                 {"onlyactive", "false"}});
#else
    throw std::runtime_error("torch " TORCH_VERSION " ships no control-plane handler header, through which gpuguard "
                             "reads ProcessGroupNCCL's flight recorder");
#endif
  }
#ifdef GPUGUARD_HAVE_FR_BACKENDS
  return c10d::dump_fr_trace_json(include_collectives, /*onlyActive=*/false, source);
#else
  (void)include_collectives;
  throw std::runtime_error("torch " TORCH_VERSION " keeps no flight recorder for the '" + source +
                           "' backend (gpuguard reads one for gloo and hooked backends from torch 2.15)");
#endif
}

int read(const char* source, int include_collectives, gpuguard_text_sink sink, void* context) {
  try {
    std::string out = dump(source, include_collectives != 0);
    sink(context, out.data(), out.size());
    return 0;
  } catch (const std::exception& e) {
    std::string what = e.what();
    sink(context, what.data(), what.size());
    return 1;
  } catch (...) {
    static const char unknown[] = "an unknown C++ exception from torch";
    sink(context, unknown, sizeof unknown - 1);
    return 1;
  }
}

const gpuguard_flight_recorder_reader kReader{kFlightRecorderReaderAbi, &read};

}  // namespace

void bind_flight_recorder_reader(pybind11::module_& m) {
  m.def("flight_recorder_reader", [] {
    return pybind11::capsule(const_cast<gpuguard_flight_recorder_reader*>(&kReader), kFlightRecorderCapsuleName);
  }, "torch's flight recorder reader for gpuguard._core.Watchdog (a capsule holding a C function; no GIL needed).");
}

}  // namespace gpuguard::python
