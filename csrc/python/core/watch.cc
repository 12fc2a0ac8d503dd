// gpuguard._core.Watchdog: binds the collective watchdog and gives it a stack dumper that runs without the GIL.
#include "watch.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <Python.h>
#include <pybind11/stl.h>

#include "gpuguard/completion_event.h"
#include "gpuguard/flight_recorder.h"
#include "gpuguard/watchdog.h"

namespace gpuguard::python {
namespace py = pybind11;
namespace {

constexpr std::size_t kMaxStackBytes = 48 * 1024;

// CPython's own GIL-free dumper, the one faulthandler uses from its watchdog thread (dump_traceback_later) and
// from signal handlers: it reads every thread's frames without taking the GIL, so it works while the main
// thread is blocked in C holding it. Declared in an internal header, and exported by libpython 3.11 and 3.12
// only (3.10 and 3.13 keep it local): looked up when the module loads, never linked, so that gpuguard._core loads on
// every Python; elsewhere faulthandler's signal handler runs it for us (below).
using DumpTracebackThreads = const char* (*)(int fd, PyInterpreterState* interp, PyThreadState* current_tstate);

DumpTracebackThreads traceback_dumper() {
  static const auto dumper =
      reinterpret_cast<DumpTracebackThreads>(::dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads"));
  return dumper;
}

// Where the dumper is not exported: faulthandler's handler for a user signal calls the same dumper, without the GIL,
// in the thread the signal is sent to. gpuguard.watch() registers one (watchdog/stacks.py:
// faulthandler.register(signum, file=..., all_threads=True)) and names the signal and the file's descriptor here; the
// watchdog's thread then sends the signal to itself, and the handler has written every Python thread's stack to
// the file by the time pthread_kill returns (a signal a thread sends itself is handled before the call returns).
std::mutex signal_dump_mutex;
int signal_dump_number = 0;  // guarded by signal_dump_mutex; 0: not armed
int signal_dump_fd = -1;

std::string read_dump(int fd) {
  std::string out;
  if (::lseek(fd, 0, SEEK_SET) == 0) {
    char buf[4096];
    ssize_t n;
    while (out.size() < kMaxStackBytes && (n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  }
  if (out.size() > kMaxStackBytes) out.resize(kMaxStackBytes);
  return out;
}

std::string dump_by_signal() {
  std::lock_guard<std::mutex> lock(signal_dump_mutex);
  if (::ftruncate(signal_dump_fd, 0) != 0 || ::lseek(signal_dump_fd, 0, SEEK_SET) != 0)
    return std::string("(no stack: the stack file cannot be reset: ") + std::strerror(errno) + ")\n";
  int rc = ::pthread_kill(::pthread_self(), signal_dump_number);
  if (rc != 0) return std::string("(no stack: pthread_kill failed: ") + std::strerror(rc) + ")\n";
  std::string out = read_dump(signal_dump_fd);
  if (out.empty()) return "(no stack: faulthandler wrote nothing: its handler for the signal was replaced)\n";
  return out;
}

bool signal_dump_armed() {
  std::lock_guard<std::mutex> lock(signal_dump_mutex);
  return signal_dump_number != 0;
}

std::string dump_python_stacks(PyInterpreterState* interp) {
  DumpTracebackThreads dump = traceback_dumper();
  if (dump == nullptr) {
    if (signal_dump_armed()) return dump_by_signal();
    std::string version = Py_GetVersion();  // "3.10.13 (main, ...": a static string, safe without the GIL
    return "(no stack: Python " + version.substr(0, version.find(' ')) +
           " does not export _Py_DumpTracebackThreads, which gpuguard needs to read stacks without the GIL, and "
           "faulthandler's signal handler was not registered in its place)\n";
  }
  std::FILE* file = std::tmpfile();
  if (file == nullptr) return "(no stack: tmpfile() failed)";
  int fd = fileno(file);
  const char* failure = dump(fd, interp, nullptr);
  std::string out = read_dump(fd);
  std::fclose(file);
  if (failure != nullptr) out += std::string("(stack dump: ") + failure + ")\n";
  return out;
}

}  // namespace

void bind_watchdog(py::module_& m) {
  py::class_<SiteRequest>(m, "SiteRequest", "The watchdog asks where a recorded collective was issued.")
      .def_readonly("id", &SiteRequest::id)
      .def_readonly("source", &SiteRequest::source)
      .def_readonly("group", &SiteRequest::group)
      .def_readonly("seq", &SiteRequest::seq);

  py::class_<Watchdog>(m, "Watchdog",
                       "One rank's collective watchdog: a C++ thread that needs no GIL (see gpuguard.watch()).")
      .def(py::init([](std::string store_host, int store_port, std::string prefix, int rank, int world_size,
                       std::string host, long pid, std::string gpu, double stall_after_s, double min_stall_s,
                       double tick_s, double gather_s, std::string report_path, bool exit_on_stall, int exit_code,
                       py::object flight_recorder, std::vector<std::string> recorder_sources,
                       std::string source_note, std::string calls_note, double site_wait_s,
                       std::string node_relay_path, bool node_leader) {
             WatchdogOptions o;
             o.store_host = std::move(store_host);
             o.store_port = store_port;
             o.prefix = std::move(prefix);
             o.rank = rank;
             o.world_size = world_size;
             o.host = std::move(host);
             o.pid = pid;
             o.gpu = std::move(gpu);
             o.stall_after_s = stall_after_s;
             o.min_stall_s = min_stall_s;
             o.tick_s = tick_s;
             o.gather_s = gather_s;
             o.report_path = std::move(report_path);
             o.exit_on_stall = exit_on_stall;
             o.exit_code = exit_code;
             if (!flight_recorder.is_none()) {
               auto* reader = static_cast<const gpuguard_flight_recorder_reader*>(
                   PyCapsule_GetPointer(flight_recorder.ptr(), kFlightRecorderCapsuleName));
               if (reader == nullptr) throw py::error_already_set();
               if (reader->abi_version != kFlightRecorderReaderAbi)
                 throw std::invalid_argument("the flight recorder reader speaks ABI " +
                                             std::to_string(reader->abi_version) + ", gpuguard._core " +
                                             std::to_string(kFlightRecorderReaderAbi) + ": reinstall gpuguard");
               o.read_recorder = flight_recorder_read(reader);
               o.recorder_sources = std::move(recorder_sources);
             }
             o.source_note = std::move(source_note);
             o.calls_note = std::move(calls_note);
             o.site_wait_s = site_wait_s;
             o.node_relay_path = std::move(node_relay_path);
             o.node_leader = node_leader;
             PyInterpreterState* interp = PyInterpreterState_Get();
             py::gil_scoped_release nogil;  // connecting may take a moment
             return std::make_unique<Watchdog>(std::move(o), [interp] { return dump_python_stacks(interp); });
           }),
           py::kw_only(), py::arg("store_host"), py::arg("store_port"), py::arg("prefix"), py::arg("rank"),
           py::arg("world_size"), py::arg("host"), py::arg("pid"), py::arg("gpu"), py::arg("stall_after_s"),
           py::arg("min_stall_s"), py::arg("tick_s"), py::arg("gather_s"), py::arg("report_path"),
           py::arg("exit_on_stall"), py::arg("exit_code"), py::arg("flight_recorder") = py::none(),
           py::arg("recorder_sources") = std::vector<std::string>{}, py::arg("source_note") = "",
           py::arg("calls_note") = "", py::arg("site_wait_s") = 5.0, py::arg("node_relay_path") = "",
           py::arg("node_leader") = false)
      .def("describe_group", &Watchdog::describe_group, py::arg("name"), py::arg("desc"), py::arg("ranks"))
      .def("add_group", &Watchdog::add_group, py::arg("name"), py::arg("desc"), py::arg("ranks"),
           py::arg("label") = "")
      .def("enter", &Watchdog::enter, py::arg("group"), py::arg("op"), py::arg("sizes"), py::arg("site"))
      .def("exit", &Watchdog::exit, py::arg("group"))
      .def("complete", &Watchdog::complete, py::arg("group"), py::arg("seq"))
      .def("exit_on_stream", [](Watchdog& dog, int group, std::uint64_t seq, std::uintptr_t stream) {
             auto event = std::make_shared<CompletionEvent>(value_or_throw(CompletionEvent::record(stream)));
             dog.exit_later(group, seq, [event] { return event->done(); });
           }, py::arg("group"), py::arg("seq"), py::arg("stream"),
           "Collective `seq` completes when the work queued on `stream` (a CUDA stream handle) so far has: a CUDA "
           "event recorded there now, polled by the watchdog's thread.")
      .def("next_site_request", &Watchdog::next_site_request, py::call_guard<py::gil_scoped_release>())
      .def("answer_site", &Watchdog::answer_site, py::arg("id"), py::arg("site"))
      .def("stop", &Watchdog::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("stall_threshold_s", &Watchdog::stall_threshold_s)
      .def_property_readonly("store_ops", &Watchdog::store_ops)
      .def_property_readonly("ticks", &Watchdog::ticks)
      .def_property_readonly("reports", &Watchdog::reports)
      .def_property_readonly("relayed_ticks", &Watchdog::relayed_ticks)
      .def_property_readonly("unrelayed_ticks", &Watchdog::unrelayed_ticks)
      .def_property_readonly("relay_max_age_s", &Watchdog::relay_max_age_s)
      .def_property_readonly("last_report_json", &Watchdog::last_report_json);

  m.def("remove_abandoned_relays", &NodeRelay::remove_abandoned, py::arg("directory"), py::arg("name_prefix"),
        py::arg("idle_s"), py::call_guard<py::gil_scoped_release>(),
        "Removes the watchdog's per-node pages (node_relay.h) whose leader wrote nothing for idle_s seconds and ten "
        "of its ticks: pages of leaders killed before they removed their own. Returns how many.");
  m.def("read_flight_recorder", [](py::object flight_recorder, const std::string& source, bool include_collectives) {
    auto* reader = static_cast<const gpuguard_flight_recorder_reader*>(
        PyCapsule_GetPointer(flight_recorder.ptr(), kFlightRecorderCapsuleName));
    if (reader == nullptr) throw py::error_already_set();
    std::string text;
    {
      py::gil_scoped_release nogil;
      auto read = flight_recorder_read(reader)(source, include_collectives);
      if (!read) throw std::runtime_error(read.error().detail);
      auto dump = parse_flight_recorder_dump(read.value());
      if (!dump) throw std::runtime_error(dump.error().detail);
      text = std::move(read).value();
    }
    return text;
  }, py::arg("flight_recorder"), py::arg("source"), py::arg("include_collectives") = false,
  "One read of torch's flight recorder as the watchdog makes it (no GIL): the JSON text, or RuntimeError naming why "
  "it cannot be used (no such recorder, no per-group status).");

  m.def("exports_stack_dumper", [] { return traceback_dumper() != nullptr; },
        "Whether this Python exports _Py_DumpTracebackThreads (3.11 and 3.12 do), which the watchdog calls itself.");
  m.def("dump_stacks_by_signal", [](int signum, int fd) {
    std::lock_guard<std::mutex> lock(signal_dump_mutex);
    signal_dump_number = signum;
    signal_dump_fd = fd;
  }, py::arg("signum"), py::arg("fd"),
  "Where this Python does not export the dumper: the signal faulthandler.register(signum, file=<fd's file>, "
  "all_threads=True) now answers, and the descriptor it writes to; the watchdog sends itself the signal for a stack.");
  m.def("dump_python_stacks", [] {
    PyInterpreterState* interp = PyInterpreterState_Get();
    py::gil_scoped_release nogil;
    return dump_python_stacks(interp);
  }, "Every Python thread's stack as faulthandler prints it, taken without the GIL (as the watchdog does).");
}

}  // namespace gpuguard::python
