// gpuguard._C: pybind11 bindings over the C++ core, and nothing else. The public API is python/gpuguard/.
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "device_check.h"
#include "gpuguard/cuda_driver.h"
#include "gpuguard/identity.h"
#include "gpuguard/nccl.h"
#include "gpuguard/nccl_probe.h"
#include "gpuguard/p2p_probe.h"
#include "gpuguard/visible_devices.h"
#include "gpuguard/tensor_devices.h"
#include "gpuguard/placement.h"
#include "record.h"

namespace py = pybind11;

namespace {

using gpuguard::python::Record;

// The enum value whose name is `name` (the core names enum values; this inverts that for records built in Python).
template <typename E>
E enum_named(const std::string& name, int count, const std::function<const char*(E)>& name_of, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (name == name_of(static_cast<E>(i))) return static_cast<E>(i);
  }
  throw py::value_error(std::string("unknown ") + what + " '" + name + "'");
}

// ---- records that cross the boundary ----------------------------------------------------------------------

void bind_records(py::module_& m) {
  using gpuguard::CudaStatus;
  using gpuguard::DeviceInfo;
  using gpuguard::Error;
  using gpuguard::IdentityRecord;
  using gpuguard::NcclProbeOutcome;
  using gpuguard::NcclStatus;
  using gpuguard::PlacementCause;
  using gpuguard::PlacementReport;
  using gpuguard::SharedDevice;
  using gpuguard::VisibleDevices;
  using gpuguard::VisibleDevicesProblem;
  using gpuguard::VisibleEntry;
  using OptStr = std::optional<std::string>;
  using OptInt = std::optional<int>;

  Record<Error>(m, "ErrorInfo", "What a library call of the core failed with.")
      .field("library", &Error::library)
      .field("call", &Error::call)
      .field("code_name", &Error::code_name)
      .field("code", &Error::code)
      .field("detail", &Error::detail)
      .field("where", &Error::where)
      .derived<std::string>("message", [](const Error& e) { return e.message(); })
      .done();

  Record<DeviceInfo> device(m, "Device",
                            "One visible CUDA device. ``index`` is its ordinal in this process (what ``cuda:N`` "
                            "means here).");
  device.field("index", &DeviceInfo::index)
      .field("name", &DeviceInfo::name)
      .field("uuid", &DeviceInfo::uuid)
      .field("pci_bus_id", &DeviceInfo::pci_bus_id)
      .field("total_memory", &DeviceInfo::total_memory)
      .field<std::tuple<int, int>>(
          "compute_capability", [](const DeviceInfo& d) { return std::make_tuple(d.cc_major, d.cc_minor); },
          [](DeviceInfo& d, const std::tuple<int, int>& cc) { std::tie(d.cc_major, d.cc_minor) = cc; })
      .field("multiprocessors", &DeviceInfo::multiprocessors);
  device.cls().def_property_readonly("total_memory_gib",
                                     [](const DeviceInfo& d) { return static_cast<double>(d.total_memory) / (1 << 30); });
  device.done();

  Record<CudaStatus> status(m, "CudaStatus",
                            "What the driver said: loaded or not, its version, how many devices, and why there "
                            "are none.");
  status.field("library_loaded", &CudaStatus::library_loaded)
      .field("initialized", &CudaStatus::initialized)
      .field("library", &CudaStatus::library)
      .field("driver_version", &CudaStatus::driver_version)
      .field("device_count", &CudaStatus::device_count)
      .field<OptStr>(
          "visible_devices_at_init",
          [](const CudaStatus& s) { return s.visible_devices_set_at_init ? OptStr(s.visible_devices_at_init) : OptStr(); },
          [](CudaStatus& s, const OptStr& v) {
            s.visible_devices_set_at_init = v.has_value();
            s.visible_devices_at_init = v.value_or("");
          })
      .field("reason", &CudaStatus::reason);
  status.cls().def_property_readonly("driver_version_string", [](const CudaStatus& s) -> std::string {
    if (!s.driver_version) return "unknown";
    return std::to_string(s.driver_version / 1000) + "." + std::to_string((s.driver_version % 1000) / 10);
  });
  status.done();

  // CUDA_VISIBLE_DEVICES parsed by the driver's rules
  using EntryKind = VisibleEntry::Kind;
  using ProblemKind = VisibleDevicesProblem::Kind;
  Record<VisibleEntry>(m, "VisibleEntry", "One entry: ``kind`` is \"index\", \"uuid\", \"uuid_prefix\" or \"mig\".")
      .field<std::string>(
          "kind", [](const VisibleEntry& e) { return VisibleDevices::kind_name(e.kind); },
          [](VisibleEntry& e, const std::string& v) {
            e.kind = enum_named<EntryKind>(v, 4, [](EntryKind k) { return VisibleDevices::kind_name(k); },
                                           "entry kind");
          })
      .field("text", &VisibleEntry::text)
      .field<OptInt>(
          "index", [](const VisibleEntry& e) { return e.kind == EntryKind::kIndex ? OptInt(e.index) : OptInt(); },
          [](VisibleEntry& e, const OptInt& v) { e.index = v.value_or(-1); })
      .field<OptStr>(
          "uuid", [](const VisibleEntry& e) { return e.kind == EntryKind::kIndex ? OptStr() : OptStr(e.uuid); },
          [](VisibleEntry& e, const OptStr& v) { e.uuid = v.value_or(""); })
      .done();

  Record<VisibleDevicesProblem>(m, "VisibilityProblem",
                                "The first entry the driver stops at: ``kind`` is \"empty\", \"malformed\", "
                                "\"duplicate\" or \"rejected\"; ``position`` is 0-based.")
      .field<std::string>(
          "kind", [](const VisibleDevicesProblem& p) { return VisibleDevices::kind_name(p.kind); },
          [](VisibleDevicesProblem& p, const std::string& v) {
            p.kind = enum_named<ProblemKind>(v, 4, [](ProblemKind k) { return VisibleDevices::kind_name(k); },
                                             "problem kind");
          })
      .field("position", &VisibleDevicesProblem::position)
      .field("entry", &VisibleDevicesProblem::entry)
      .field<OptInt>(
          "same_as", [](const VisibleDevicesProblem& p) { return p.same_as >= 0 ? OptInt(p.same_as) : OptInt(); },
          [](VisibleDevicesProblem& p, const OptInt& v) { p.same_as = v.value_or(-1); })
      .field("reason", &VisibleDevicesProblem::reason)
      .done();

  Record<VisibleDevices> visible(m, "VisibleDevices",
                                 "CUDA_VISIBLE_DEVICES as the driver reads it: ``entries`` are what it honours "
                                 "(those before the first problem).");
  visible.field("set", &VisibleDevices::set)
      .field<OptStr>(
          "raw", [](const VisibleDevices& v) { return v.set ? OptStr(v.raw) : OptStr(); },
          [](VisibleDevices& v, const OptStr& raw) { v.raw = raw.value_or(""); })
      .field("entries", &VisibleDevices::entries)
      .field("problem", &VisibleDevices::problem)
      .field("hides_all_on_purpose", &VisibleDevices::hides_all_on_purpose);
  visible.cls().def("describe", [](const VisibleDevices& v) -> std::string {
    if (!v.set) return "CUDA_VISIBLE_DEVICES unset";
    return "CUDA_VISIBLE_DEVICES=" + std::string(py::repr(py::str(v.raw)));
  }, "For messages: ``CUDA_VISIBLE_DEVICES='0,1'`` or ``CUDA_VISIBLE_DEVICES unset``.");
  visible.done();

  // identity records and the placement analysis
  Record<IdentityRecord> identity(m, "IdentityRecord",
                                  "One rank's identity record, the who-is-where the ranks exchange.");
  identity.field("rank", &IdentityRecord::rank)
      .field("world_size", &IdentityRecord::world_size)
      .field("group", &IdentityRecord::group)
      .field("local_rank", &IdentityRecord::local_rank)
      .field("local_world_size", &IdentityRecord::local_world_size)
      .field("host_hash", &IdentityRecord::host_hash)
      .field("hostname", &IdentityRecord::hostname)
      .field("gpu_uuid", &IdentityRecord::gpu_uuid)
      .field("pci_bus_id", &IdentityRecord::pci_bus_id)
      .field("gpu_index", &IdentityRecord::gpu_index)
      .field("pid", &IdentityRecord::pid)
      .field("cuda_visible_devices", &IdentityRecord::cuda_visible_devices)
      .field("visible_device_count", &IdentityRecord::visible_device_count)
      .field("launcher", &IdentityRecord::launcher)
      .field("multi_rank_gpu_enabled", &IdentityRecord::multi_rank_gpu_enabled)
      .field("failure_kind", &IdentityRecord::failure_kind)
      .field("failure_text", &IdentityRecord::failure_text)
      .field("gpu_fraction", &IdentityRecord::gpu_fraction)
      .field("ray_gpu_ids", &IdentityRecord::ray_gpu_ids);
  identity.cls()
      .def("encode", [](const IdentityRecord& r) {
        auto bytes = gpuguard::encode_identity(r);
        if (!bytes) {
          py::object error = py::module_::import("gpuguard.errors").attr("GpuGuardError");
          py::dict details;
          details["rank"] = r.rank;
          PyErr_SetObject(error.ptr(), error("gpuguard could not describe rank " + std::to_string(r.rank) +
                                                 " for the cross-rank check: " + bytes.error().message(),
                                             **details).ptr());
          throw py::error_already_set();
        }
        return py::bytes(bytes.value());
      }, "The compact encoding peers decode; GpuGuardError naming the bad field.")
      .def_static("decode", [](const py::bytes& data) {
        auto r = gpuguard::decode_identity(std::string_view(data));
        if (!r) throw py::value_error(r.error().message());
        return std::move(r).value();
      }, py::arg("data"), "Strictly decodes a peer's identity record; ValueError saying what is malformed.");
  identity.done();

  auto cause_names = [](const std::vector<PlacementCause>& causes) {
    std::vector<std::string> out;
    for (auto c : causes) out.emplace_back(gpuguard::placement_cause_name(c));
    return out;
  };
  auto causes_named = [](const std::vector<std::string>& names) {
    std::vector<PlacementCause> out;
    for (const auto& n : names) {
      out.push_back(enum_named<PlacementCause>(n, 6, gpuguard::placement_cause_name, "placement cause"));
    }
    return out;
  };
  using Names = std::vector<std::string>;
  Record<SharedDevice>(m, "SharedDevice", "One GPU that several ranks of a group sit on; ``records`` by rank.")
      .field("group", &SharedDevice::group)
      .field("gpu_uuid", &SharedDevice::gpu_uuid)
      .field("pci_bus_id", &SharedDevice::pci_bus_id)
      .field("total_ranks", &SharedDevice::total_ranks)
      .field("records", &SharedDevice::ranks)
      .field<Names>("causes", [=](const SharedDevice& d) { return cause_names(d.causes); },
                    [=](SharedDevice& d, const Names& v) { d.causes = causes_named(v); })
      .field("warning_only", &SharedDevice::warning_only)
      .derived<std::vector<int>>("ranks", [](const SharedDevice& d) {
        std::vector<int> out;
        for (const auto& r : d.ranks) out.push_back(r.rank);
        return out;
      })
      .derived<Names>("hosts", [](const SharedDevice& d) {
        Names out;
        for (const auto& r : d.ranks) out.push_back(r.hostname);
        return out;
      })
      .done();

  using Severity = PlacementReport::Severity;
  Record<PlacementReport>(m, "PlacementReport", "The duplicate-device analysis: severity, the full message, the "
                                                "shared devices.")
      .field<std::string>("severity", [](const PlacementReport& r) { return r.severity_name(); },
                          [](PlacementReport& r, const std::string& v) {
                            r.severity = enum_named<Severity>(v, 3, [](Severity s) {
                              PlacementReport tmp;
                              tmp.severity = s;
                              return tmp.severity_name();
                            }, "severity");
                          })
      .field("message", &PlacementReport::message)
      .field("shared_devices_total", &PlacementReport::shared_devices_total)
      .field("ranks_sharing_total", &PlacementReport::ranks_sharing_total)
      .field<Names>("causes", [=](const PlacementReport& r) { return cause_names(r.causes); },
                    [=](PlacementReport& r, const Names& v) { r.causes = causes_named(v); })
      .field("shared", &PlacementReport::shared)
      .done();

  // NCCL
  Record<NcclStatus>(m, "NcclStatus", "NCCL as gpuguard's loader found it; ``reason`` says why it is unusable.")
      .field("loaded", &NcclStatus::loaded)
      .field("already_in_process", &NcclStatus::already_in_process)
      .field("library", &NcclStatus::library)
      .field("version", &NcclStatus::version)
      .field("version_string", &NcclStatus::version_string)
      .field("reason", &NcclStatus::reason)
      .done();

  using Verdict = NcclProbeOutcome::Verdict;
  Record<NcclProbeOutcome>(m, "NcclProbeOutcome",
                           "One rank's NCCL probe: ``verdict`` is \"ok\", \"failed\" or \"timed out\"; ``error`` "
                           "is None when ok.")
      .field<std::string>("verdict", [](const NcclProbeOutcome& o) { return o.verdict_name(); },
                          [](NcclProbeOutcome& o, const std::string& v) {
                            o.verdict = enum_named<Verdict>(v, 3, [](Verdict k) {
                              NcclProbeOutcome tmp;
                              tmp.verdict = k;
                              return tmp.verdict_name();
                            }, "verdict");
                          })
      .derived<bool>("ok", [](const NcclProbeOutcome& o) { return o.ok(); })
      .field("stage", &NcclProbeOutcome::stage)
      .field<std::optional<Error>>(
          "error", [](const NcclProbeOutcome& o) { return o.ok() ? std::optional<Error>() : o.error; },
          [](NcclProbeOutcome& o, const std::optional<Error>& e) { o.error = e.value_or(Error{}); })
      .field("last_error", &NcclProbeOutcome::last_error)
      .field("aborted", &NcclProbeOutcome::aborted)
      .field("elapsed_s", &NcclProbeOutcome::elapsed_s)
      .field("init_s", &NcclProbeOutcome::init_s)
      .field("all_reduce_result", &NcclProbeOutcome::all_reduce_result)
      .field("nccl_version", &NcclProbeOutcome::nccl_version)
      .field("library", &NcclProbeOutcome::library)
      .done();

  using InitRecord = gpuguard::CudaDriver::InitRecord;
  Record<InitRecord>(m, "DriverInitRecord",
                     "What gpuguard's cuInit saw: whether it ran, and the CUDA_VISIBLE_DEVICES the driver froze then.")
      .field("attempted", &InitRecord::attempted)
      .field("succeeded", &InitRecord::succeeded)
      .field<OptStr>(
          "visible_devices_at_init",
          [](const InitRecord& r) { return r.visible_set ? OptStr(r.visible) : OptStr(); },
          [](InitRecord& r, const OptStr& v) {
            r.visible_set = v.has_value();
            r.visible = v.value_or("");
          })
      .field("initialized_before_gpuguard", &InitRecord::initialized_before_gpuguard)
      .done();

  using gpuguard::HostFingerprint;
  Record<HostFingerprint>(m, "HostFingerprint", "This host as NCCL identifies it, and what was hashed.")
      .field("hostname", &HostFingerprint::hostname)
      .field("hashed", &HostFingerprint::hashed)
      .field("hash", &HostFingerprint::hash)
      .field("from_nccl_hostid", &HostFingerprint::from_nccl_hostid)
      .done();

  using gpuguard::PeerCopyResult;
  using OptSize = std::optional<std::size_t>;
  Record<PeerCopyResult>(m, "PeerCopyResult", "One verified GPU-to-GPU copy (gpuguard doctor --p2p).")
      .field("src", &PeerCopyResult::src)
      .field("dst", &PeerCopyResult::dst)
      .field("bytes", &PeerCopyResult::bytes)
      .field("peer_access_reported", &PeerCopyResult::peer_access_reported)
      .field("peer_access_enabled", &PeerCopyResult::peer_access_enabled)
      .field("verified", &PeerCopyResult::verified)
      .field("mismatched_bytes", &PeerCopyResult::mismatched_bytes)
      .field<OptSize>(
          "first_mismatch",
          [](const PeerCopyResult& r) { return r.mismatched_bytes ? OptSize(r.first_mismatch) : OptSize(); },
          [](PeerCopyResult& r, const OptSize& v) { r.first_mismatch = v.value_or(0); })
      .field("destination_unchanged", &PeerCopyResult::destination_unchanged)
      .field("copy_milliseconds", &PeerCopyResult::copy_milliseconds)
      .done();
}

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

  m.def("can_access_peer", [](int a, int b) {
    auto r = gpuguard::CudaDriver::instance().can_access_peer(a, b);
    if (!r) throw std::runtime_error(r.error().message());
    return r.value();
  });
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


// ---- tensor devices (issue: tensor-device consistency) ----------------------------------------------------

void bind_tensor_devices(py::module_& m) {
  namespace gp = gpuguard::python;
  m.def("check_call", &gp::check_call, py::arg("module"), py::arg("args"), py::arg("kwargs"),
        py::arg("expected"), py::arg("labels"),
        "The common torch.device of a module's parameters and buffers (module may be None) and every tensor in "
        "args/kwargs; None when there is none. Raises gpuguard.DeviceMismatchError.");
  m.def("checks_disabled", &gp::checks_disabled, "Whether GPUGUARD_DISABLE turns every check off.");
  m.def("compress_names", &gpuguard::compress_names, py::arg("names"), py::arg("universe"),
        "Qualified names with whole subtrees and index runs compressed (layers.0-15.*).");
  m.def("forward_hook", &gp::make_forward_hook,
        "A new forward pre-hook (with_kwargs=True) for guard(module): the whole tree against the inputs.");
  m.def("layer_hook", &gp::make_layer_hook, py::arg("name"), py::arg("type"),
        "A new forward pre-hook (with_kwargs=True) for one layer under guard(module, deep=True).");
  py::class_<gp::TreeWatch>(m, "TreeWatch", "Tells whether a module tree changed since it was last seen.")
      .def(py::init<>())
      .def("changed", &gp::TreeWatch::changed, py::arg("module"));
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
  }, "Loads NCCL (the copy already in the process first; $GPUGUARD_LIBNCCL overrides) and says what it is.");

  m.def("nccl_unique_id", []() -> py::bytes {
    gpuguard::Result<gpuguard::NcclUniqueId> id = gpuguard::Error{};
    {
      py::gil_scoped_release nogil;
      id = gpuguard::Nccl::instance().unique_id();
    }
    if (!id) throw std::runtime_error(id.error().message());
    return py::bytes(id.value().data(), id.value().size());
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


}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpuguard's compiled core (private; use the gpuguard package)";
  bind_records(m);
  bind_cuda_driver(m);
  bind_nccl(m);
  bind_diagnostics(m);
  bind_binding(m);
  bind_tensor_devices(m);
  bind_identity_placement(m);
}
