// The records that cross C++/Python, each bound as a class from one list of its fields (see record.h).
#include "records.h"

#include <functional>
#include <optional>
#include <string>
#include <tuple>

#include <pybind11/stl.h>

#include "gpuguard/cuda_driver.h"
#include "gpuguard/identity.h"
#include "gpuguard/nccl.h"
#include "gpuguard/nccl_probe.h"
#include "gpuguard/nvml.h"
#include "gpuguard/p2p_probe.h"
#include "gpuguard/placement.h"
#include "gpuguard/visible_devices.h"
#include "record.h"

namespace gpuguard::python {

namespace {

// The enum value whose name is `name` (the core names enum values; this inverts that for records built in Python).
template <typename E>
E enum_named(const std::string& name, int count, const std::function<const char*(E)>& name_of, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (name == name_of(static_cast<E>(i))) return static_cast<E>(i);
  }
  throw py::value_error(std::string("unknown ") + what + " '" + name + "'");
}

}  // namespace

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
      out.push_back(enum_named<PlacementCause>(n, gpuguard::kPlacementCauseCount, gpuguard::placement_cause_name, "placement cause"));
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
  Record<gpuguard::GpuProcess>(m, "GpuProcess",
                                "One process with a compute context on a GPU, as NVML lists it (``used_memory`` in "
                                "bytes, -1 when NVML cannot say).")
      .field("pid", &gpuguard::GpuProcess::pid)
      .field("used_memory", &gpuguard::GpuProcess::used_memory)
      .done();

  Record<gpuguard::GpuUsage>(m, "GpuUsage",
                              "What NVML says of one GPU or MIG instance: its memory (bytes) and its compute processes "
                              "(``reserved_memory`` -1 when unknown).")
      .field("uuid", &gpuguard::GpuUsage::uuid)
      .field("total_memory", &gpuguard::GpuUsage::total_memory)
      .field("used_memory", &gpuguard::GpuUsage::used_memory)
      .field("free_memory", &gpuguard::GpuUsage::free_memory)
      .field("reserved_memory", &gpuguard::GpuUsage::reserved_memory)
      .field("processes", &gpuguard::GpuUsage::processes)
      .done();

  Record<gpuguard::NvmlStatus>(m, "NvmlStatus", "NVML as gpuguard's loader found it; ``reason`` says why it is unusable.")
      .field("library_loaded", &gpuguard::NvmlStatus::library_loaded)
      .field("initialized", &gpuguard::NvmlStatus::initialized)
      .field("library", &gpuguard::NvmlStatus::library)
      .field("driver_version", &gpuguard::NvmlStatus::driver_version)
      .field("reason", &gpuguard::NvmlStatus::reason)
      .done();

  Record<NcclStatus>(m, "NcclStatus", "NCCL as gpuguard's loader found it; ``reason`` says why it is unusable.")
      .field("loaded", &NcclStatus::loaded)
      .field("already_in_process", &NcclStatus::already_in_process)
      .field("library", &NcclStatus::library)
      .field("found_by", &NcclStatus::found_by)
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

}  // namespace gpuguard::python
