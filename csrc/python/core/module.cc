// gpuguard._core: the torch-free module and its functions over the C++ core; records.cc binds the classes they return.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include <pybind11/pybind11.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "gpuguard/cuda_driver.h"
#include "gpuguard/identity.h"
#include "gpuguard/nccl.h"
#include "gpuguard/nccl_probe.h"
#include "gpuguard/nvml.h"
#include "gpuguard/p2p_probe.h"
#include "gpuguard/visible_devices.h"
#include "gpuguard/placement.h"
#include "gpuguard/tcp_store_client.h"
#include "records.h"
#include "scanner.h"
#include "watch.h"

namespace py = pybind11;

namespace {

// ---- CUDA driver ------------------------------------------------------------------------------------------

void bind_cuda_driver(py::module_& m) {
  m.def("cuda_status", [] {
    py::gil_scoped_release nogil;
    return gpuguard::CudaDriver::instance().status();
  }, "Why the CUDA driver does or does not show devices. Loads the driver and calls cuInit.");

  using Enumeration = std::tuple<std::vector<gpuguard::DeviceInfo>, std::optional<gpuguard::Error>>;
  m.def("enumerate_devices", []() -> Enumeration {
    py::gil_scoped_release nogil;
    auto& driver = gpuguard::CudaDriver::instance();
    auto st = driver.status();
    if (st.initialized && st.device_count == 0) return Enumeration{};
    auto result = driver.devices();
    if (!result) return Enumeration{std::vector<gpuguard::DeviceInfo>{}, result.error()};
    return Enumeration{result.value(), std::nullopt};
  }, "(devices, error): the visible devices, or [] and what prevented enumeration.");

  m.def("driver_initialized", [] { return gpuguard::CudaDriver::instance().initialized(); },
        "Whether gpuguard has called cuInit in this process.");

  m.def("active_primary_contexts", [] {
    gpuguard::Result<std::vector<int>> active = std::vector<int>{};
    {
      py::gil_scoped_release nogil;
      active = gpuguard::CudaDriver::instance().active_primary_contexts();
    }
    return gpuguard::value_or_throw(std::move(active));
  }, "The visible devices (cuda:N ordinals) on which this process holds an active primary context; creates "
     "none and never calls cuInit (nothing initialised: []).");

  m.def("can_access_peer", [](int a, int b) {
    return gpuguard::value_or_throw(gpuguard::CudaDriver::instance().can_access_peer(a, b));
  });
}

// ---- NVML: who holds memory on a GPU ----------------------------------------------------------------------

void bind_nvml(py::module_& m) {
  m.def("nvml_status", [] {
    py::gil_scoped_release nogil;
    return gpuguard::Nvml::instance().status();
  }, "Loads NVML ($GPUGUARD_LIBNVML overrides libnvidia-ml.so.1), initialises it and says what it is.");

  using Usage = std::tuple<std::optional<gpuguard::GpuUsage>, std::optional<gpuguard::Error>>;
  m.def("gpu_usage", [](const std::string& uuid, const std::string& pci_bus_id) -> Usage {
    py::gil_scoped_release nogil;
    auto usage = gpuguard::Nvml::instance().usage(uuid, pci_bus_id);
    if (!usage) return Usage{std::nullopt, usage.error()};
    return Usage{std::move(usage).value(), std::nullopt};
  }, py::arg("uuid"), py::arg("pci_bus_id") = "",
     "(usage, error): NVML's memory and compute processes of the GPU or MIG instance with this UUID (else the "
     "GPU at pci_bus_id), or None and what prevented it.");
}

// ---- binding each process to its GPU (issue: bind) ---------------------------------------------------------

void bind_binding(py::module_& m) {
  m.def("parse_visible_devices", [](std::optional<std::string> raw) {
    return gpuguard::parse_visible_devices(raw ? raw->c_str() : nullptr);
  }, py::arg("raw"), "CUDA_VISIBLE_DEVICES parsed by the driver's rules; the first entry it would stop at.");

  m.def("find_rejected_entry", [](std::optional<std::string> raw, const std::vector<std::string>& visible_uuids) {
    auto spec = gpuguard::parse_visible_devices(raw ? raw->c_str() : nullptr);
    return gpuguard::find_rejected_entry(spec, visible_uuids);
  }, py::arg("raw"), py::arg("visible_uuids"),
     "The entry of `raw` the driver rejected, given the UUIDs it enumerated; None when it took every entry.");

  m.def("driver_init_record", [] { return gpuguard::CudaDriver::instance().init_record(); },
        "What gpuguard's cuInit saw (never initialises anything).");
}


// ---- identity records and placement (issue: duplicate-device detection) -----------------------------------

void bind_identity_placement(py::module_& m) {
  m.def("host_fingerprint", &gpuguard::host_fingerprint,
        "This host as NCCL identifies it: hostname + boot id (or $NCCL_HOSTID), hashed with NCCL's DJB2a.");

  m.def("analyze_placement",
        [](const std::vector<py::bytes>& encoded, const std::map<std::string, int>& device_rank_totals,
           const std::map<std::uint64_t, int>& host_rank_totals, int shared_devices_total, int ranks_sharing_total) {
          std::vector<gpuguard::IdentityRecord> records;
          records.reserve(encoded.size());
          for (std::size_t i = 0; i < encoded.size(); ++i) {
            auto r = gpuguard::decode_identity(std::string_view(encoded[i]));
            if (!r) throw py::value_error("record " + std::to_string(i) + ": " + r.error().message());
            records.push_back(std::move(r).value());
          }
          gpuguard::PlacementContext ctx;
          ctx.device_rank_totals = device_rank_totals;
          ctx.host_rank_totals = host_rank_totals;
          ctx.shared_devices_total = shared_devices_total;
          ctx.ranks_sharing_total = ranks_sharing_total;
          return gpuguard::analyze_placement(records, ctx);
        },
        py::arg("records"), py::arg("device_rank_totals") = std::map<std::string, int>{},
        py::arg("host_rank_totals") = std::map<std::uint64_t, int>{}, py::arg("shared_devices_total") = -1,
        py::arg("ranks_sharing_total") = -1,
        "Duplicate-device analysis over encoded identity records (a sample with true totals, or all of them).");
}


// ---- NCCL (issue: duplicate-device detection, verify_nccl) ------------------------------------------------

void bind_nccl(py::module_& m) {
  m.def("nccl_status", [] {
    gpuguard::NcclStatus st;
    {
      py::gil_scoped_release nogil;
      st = gpuguard::Nccl::instance().status();
    }
    return st;
  }, "Loads NCCL (the copy already in the process first, then nccl_prefer()'s; $GPUGUARD_LIBNCCL overrides) and "
     "says what it is.");

  m.def("nccl_prefer", [](std::string path, std::string origin) {
    return gpuguard::Nccl::instance().prefer(std::move(path), std::move(origin));
  }, py::arg("path"), py::arg("origin"),
     "Before NCCL is loaded: try `path` (torch's NCCL) before the loader's search; False once it is loaded.");

  m.def("nccl_unique_id", []() -> py::bytes {
    gpuguard::Result<gpuguard::NcclUniqueId> id = gpuguard::Error{};
    {
      py::gil_scoped_release nogil;
      id = gpuguard::Nccl::instance().unique_id();
    }
    auto bytes = gpuguard::value_or_throw(std::move(id));
    return py::bytes(bytes.data(), bytes.size());
  }, "ncclGetUniqueId: 128 bytes for rank 0 to publish to the others.");

  m.def("nccl_probe", [](int nranks, int rank, py::bytes unique_id, int device, double timeout_s, bool all_reduce) {
    std::string id = unique_id;
    if (id.size() != gpuguard::nccl::kUniqueIdBytes) {
      throw py::value_error("an NCCL unique id is " + std::to_string(gpuguard::nccl::kUniqueIdBytes) + " bytes, not " +
                            std::to_string(id.size()));
    }
    gpuguard::NcclProbeOptions o;
    o.nranks = nranks;
    o.rank = rank;
    std::copy(id.begin(), id.end(), o.unique_id.begin());
    o.device = device;
    o.timeout_s = timeout_s;
    o.all_reduce = all_reduce;
    gpuguard::NcclProbeOutcome out;
    {
      py::gil_scoped_release nogil;
      out = gpuguard::run_nccl_probe(o);
    }
    return out;
  }, py::arg("nranks"), py::arg("rank"), py::arg("unique_id"), py::arg("device"), py::arg("timeout_s"),
     py::arg("all_reduce") = false,
     "One rank's part in forming an NCCL communicator (non-blocking init under a deadline, abort on timeout) "
     "and, with all_reduce=True, one small float32 sum checked for the right result. Never raises for NCCL "
     "failures: the outcome says what happened (verdict 'ok' | 'failed' | 'timed out', stage, error, last_error).");
}


// ---- diagnostics (issue: doctor/explain) ------------------------------------------------------------------

void bind_diagnostics(py::module_& m) {
  m.def("peer_copy_probe", [](int src, int dst, std::size_t bytes) {
    gpuguard::Result<gpuguard::PeerCopyResult> r = gpuguard::Error{};
    {
      py::gil_scoped_release nogil;  // a broken driver may block here; the caller runs it under a deadline
      r = gpuguard::peer_copy_probe(src, dst, bytes);
    }
    return r ? std::make_tuple(std::optional<gpuguard::PeerCopyResult>(r.value()), std::optional<gpuguard::Error>())
             : std::make_tuple(std::optional<gpuguard::PeerCopyResult>(), std::optional<gpuguard::Error>(r.error()));
  }, py::arg("src"), py::arg("dst"), py::arg("bytes"),
     "(result, error): copies `bytes` from visible device src to dst (peer access enabled where offered) and "
     "verifies them; or None and what failed.");
}


// ---- the job's TCPStore without torch (gpuguard check under torchrun) ----------------------------------------

// torch.distributed.Store's methods over TcpStoreClient, keys under `prefix` as torch's PrefixStore joins them.
class TcpStore {
 public:
  TcpStore(std::string host, int port, double timeout_s, std::string prefix)
      : prefix_(prefix.empty() ? prefix : prefix + "/") {
    auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::max(timeout_s, 0.001) * 1000));
    py::gil_scoped_release nogil;
    client_ = gpuguard::value_or_throw(gpuguard::TcpStoreClient::connect(std::move(host), port, timeout));
  }
  void set(const std::string& key, const py::bytes& value) {
    std::string v = value;
    py::gil_scoped_release nogil;
    gpuguard::value_or_throw(client_->set(prefix_ + key, v));
  }
  py::bytes get(const std::string& key) {
    std::string v;
    {
      py::gil_scoped_release nogil;
      v = gpuguard::value_or_throw(client_->get(prefix_ + key));
    }
    return py::bytes(v);
  }
  std::int64_t add(const std::string& key, std::int64_t amount) {
    py::gil_scoped_release nogil;
    return gpuguard::value_or_throw(client_->add(prefix_ + key, amount));
  }
  bool check(const std::vector<std::string>& keys) {
    auto wire = prefixed(keys);
    py::gil_scoped_release nogil;
    return gpuguard::value_or_throw(client_->check(wire));
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    auto wire = prefixed(keys);
    py::gil_scoped_release nogil;
    gpuguard::value_or_throw(client_->wait(wire, timeout));
  }
  // torch.distributed.Store's timeout: what get() waits for its key, and the bound of every other call.
  std::chrono::milliseconds timeout() const { return client_->timeout(); }
  void set_timeout(std::chrono::milliseconds timeout) { client_->set_timeout(timeout); }
  py::bytes compare_set(const std::string& key, const py::bytes& expected, const py::bytes& desired) {
    std::string e = expected, d = desired, v;
    {
      py::gil_scoped_release nogil;
      v = gpuguard::value_or_throw(client_->compare_set(prefix_ + key, e, d));
    }
    return py::bytes(v);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::string prefix_;
  std::unique_ptr<gpuguard::TcpStoreClient> client_;
};

void bind_tcp_store(py::module_& m) {
  py::class_<TcpStore>(m, "TcpStore",
                       "A client of a c10d TCPStore with torch.distributed.Store's methods, without torch "
                       "(gpuguard/tcp_store_client.h): every call bounded by timeout_s; keys under prefix as "
                       "torch.distributed.PrefixStore(prefix, store) names them. Raises RuntimeError naming the store.")
      .def(py::init<std::string, int, double, std::string>(), py::arg("host"), py::arg("port"),
           py::arg("timeout_s"), py::arg("prefix") = "")
      .def("set", &TcpStore::set, py::arg("key"), py::arg("value"))
      .def("get", &TcpStore::get, py::arg("key"))
      .def("add", &TcpStore::add, py::arg("key"), py::arg("amount"))
      .def("check", &TcpStore::check, py::arg("keys"))
      .def("wait", &TcpStore::wait, py::arg("keys"), py::arg("timeout"))
      .def("compare_set", &TcpStore::compare_set, py::arg("key"), py::arg("expected"), py::arg("desired"))
      .def_property_readonly("timeout", &TcpStore::timeout)
      .def("set_timeout", &TcpStore::set_timeout, py::arg("timeout"));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "gpuguard's torch-free compiled core (private; use the gpuguard package)";
  gpuguard::python::bind_records(m);
  bind_cuda_driver(m);
  bind_nvml(m);
  bind_nccl(m);
  bind_diagnostics(m);
  bind_binding(m);
  bind_identity_placement(m);
  bind_tcp_store(m);
  gpuguard::python::bind_watchdog(m);
  gpuguard::python::add_scanner(m);
}
