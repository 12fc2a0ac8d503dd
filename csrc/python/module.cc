// gpuguard._C: pybind11 bindings over the C++ core, and nothing else. The public API is python/gpuguard/.
#include <algorithm>
#include <map>

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

namespace py = pybind11;

namespace {

py::dict device_to_dict(const gpuguard::DeviceInfo& d) {
  py::dict out;
  out["index"] = d.index;
  out["name"] = d.name;
  out["uuid"] = d.uuid;
  out["pci_bus_id"] = d.pci_bus_id;
  out["total_memory"] = d.total_memory;
  out["compute_capability"] = py::make_tuple(d.cc_major, d.cc_minor);
  out["multiprocessors"] = d.multiprocessors;
  return out;
}

py::dict error_to_dict(const gpuguard::Error& e) {
  py::dict out;
  out["library"] = e.library;
  out["call"] = e.call;
  out["code_name"] = e.code_name;
  out["code"] = e.code;
  out["detail"] = e.detail;
  out["message"] = e.message();
  return out;
}

// ---- CUDA driver ------------------------------------------------------------------------------------------

void bind_cuda_driver(py::module_& m) {
  m.def("cuda_status", [] {
    py::gil_scoped_release nogil;
    auto st = gpuguard::CudaDriver::instance().status();
    py::gil_scoped_acquire gil;
    py::dict out;
    out["library_loaded"] = st.library_loaded;
    out["initialized"] = st.initialized;
    out["library"] = st.library;
    out["driver_version"] = st.driver_version;
    out["device_count"] = st.device_count;
    out["visible_devices_at_init"] = st.visible_devices_set_at_init ? py::object(py::str(st.visible_devices_at_init))
                                                                   : py::object(py::none());
    out["reason"] = st.reason;
    return out;
  }, "Why the CUDA driver does or does not show devices. Loads the driver and calls cuInit.");

  m.def("enumerate_devices", []() -> py::tuple {
    gpuguard::Result<std::vector<gpuguard::DeviceInfo>> result = gpuguard::Error{};
    {
      py::gil_scoped_release nogil;
      auto& driver = gpuguard::CudaDriver::instance();
      auto st = driver.status();
      if (st.initialized && st.device_count == 0) {
        result = std::vector<gpuguard::DeviceInfo>{};
      } else {
        result = driver.devices();
      }
    }
    py::list devices;
    if (!result) return py::make_tuple(devices, error_to_dict(result.error()));
    for (const auto& d : result.value()) devices.append(device_to_dict(d));
    return py::make_tuple(devices, py::none());
  }, "(devices, error): the visible devices as dicts, or [] and what prevented enumeration.");

  m.def("driver_initialized", [] { return gpuguard::CudaDriver::instance().initialized(); },
        "Whether gpuguard has called cuInit in this process.");

  m.def("can_access_peer", [](int a, int b) {
    auto r = gpuguard::CudaDriver::instance().can_access_peer(a, b);
    if (!r) throw std::runtime_error(r.error().message());
    return r.value();
  });
}

// ---- binding each process to its GPU (issue: bind) ---------------------------------------------------------

py::object visible_problem_to_python(const std::optional<gpuguard::VisibleDevicesProblem>& p) {
  if (!p) return py::none();
  py::dict out;
  out["kind"] = gpuguard::VisibleDevices::kind_name(p->kind);
  out["position"] = p->position;
  out["entry"] = p->entry;
  out["same_as"] = p->same_as >= 0 ? py::object(py::int_(p->same_as)) : py::object(py::none());
  out["reason"] = p->reason;
  return out;
}

void bind_binding(py::module_& m) {
  m.def("parse_visible_devices", [](std::optional<std::string> raw) {
    auto spec = gpuguard::parse_visible_devices(raw ? raw->c_str() : nullptr);
    py::list entries;
    for (const auto& e : spec.entries) {
      py::dict d;
      d["kind"] = gpuguard::VisibleDevices::kind_name(e.kind);
      d["text"] = e.text;
      d["index"] = e.kind == gpuguard::VisibleEntry::Kind::kIndex ? py::object(py::int_(e.index)) : py::object(py::none());
      d["uuid"] = e.kind == gpuguard::VisibleEntry::Kind::kIndex ? py::object(py::none()) : py::object(py::str(e.uuid));
      entries.append(d);
    }
    py::dict out;
    out["set"] = spec.set;
    out["raw"] = spec.set ? py::object(py::str(spec.raw)) : py::object(py::none());
    out["entries"] = entries;
    out["problem"] = visible_problem_to_python(spec.problem);
    out["hides_all_on_purpose"] = spec.hides_all_on_purpose;
    return out;
  }, py::arg("raw"), "CUDA_VISIBLE_DEVICES parsed by the driver's rules; the first entry it would stop at.");

  m.def("find_rejected_entry", [](std::optional<std::string> raw, const std::vector<std::string>& visible_uuids) {
    auto spec = gpuguard::parse_visible_devices(raw ? raw->c_str() : nullptr);
    return visible_problem_to_python(gpuguard::find_rejected_entry(spec, visible_uuids));
  }, py::arg("raw"), py::arg("visible_uuids"),
     "The entry of `raw` the driver rejected, given the UUIDs it enumerated; None when it took every entry.");

  m.def("driver_init_record", [] {
    auto r = gpuguard::CudaDriver::instance().init_record();
    py::dict out;
    out["attempted"] = r.attempted;
    out["succeeded"] = r.succeeded;
    out["visible_devices_at_init"] = r.visible_set ? py::object(py::str(r.visible)) : py::object(py::none());
    out["initialized_before_gpuguard"] = r.initialized_before_gpuguard;
    return out;
  }, "What gpuguard's cuInit saw (never initialises anything).");
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

// Records cross the Python boundary as dicts with the field names of gpuguard::IdentityRecord.
gpuguard::IdentityRecord record_from_dict(const py::dict& d) {
  gpuguard::IdentityRecord r;
  auto get = [&](const char* key) -> py::object { return d.contains(key) ? py::object(d[key]) : py::object(py::none()); };
  auto text = [&](const char* key, std::string& out) {
    py::object v = get(key);
    if (!v.is_none()) out = v.cast<std::string>();
  };
  auto integer = [&](const char* key, auto& out) {
    py::object v = get(key);
    if (!v.is_none()) out = v.cast<std::remove_reference_t<decltype(out)>>();
  };
  for (auto item : d) {
    static const char* known[] = {"group", "rank", "local_rank", "world_size", "local_world_size", "host_hash",
                                  "hostname", "gpu_uuid", "pci_bus_id", "gpu_index", "pid", "cuda_visible_devices",
                                  "visible_device_count", "launcher", "multi_rank_gpu_enabled", "failure_kind",
                                  "failure_text", "gpu_fraction", "ray_gpu_ids"};
    std::string key = py::str(item.first);
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) == std::end(known)) {
      throw py::value_error("unknown identity field '" + key + "'");
    }
  }
  text("group", r.group);
  integer("rank", r.rank);
  integer("local_rank", r.local_rank);
  integer("world_size", r.world_size);
  integer("local_world_size", r.local_world_size);
  integer("host_hash", r.host_hash);
  text("hostname", r.hostname);
  text("gpu_uuid", r.gpu_uuid);
  text("pci_bus_id", r.pci_bus_id);
  integer("gpu_index", r.gpu_index);
  integer("pid", r.pid);
  if (!get("cuda_visible_devices").is_none()) r.cuda_visible_devices = get("cuda_visible_devices").cast<std::string>();
  integer("visible_device_count", r.visible_device_count);
  text("launcher", r.launcher);
  if (!get("multi_rank_gpu_enabled").is_none()) r.multi_rank_gpu_enabled = get("multi_rank_gpu_enabled").cast<bool>();
  if (!get("failure_kind").is_none()) r.failure_kind = get("failure_kind").cast<std::string>();
  text("failure_text", r.failure_text);
  if (!get("gpu_fraction").is_none()) r.gpu_fraction = get("gpu_fraction").cast<double>();
  text("ray_gpu_ids", r.ray_gpu_ids);
  return r;
}

py::dict record_to_dict(const gpuguard::IdentityRecord& r) {
  py::dict d;
  d["group"] = r.group;
  d["rank"] = r.rank;
  d["local_rank"] = r.local_rank;
  d["world_size"] = r.world_size;
  d["local_world_size"] = r.local_world_size;
  d["host_hash"] = r.host_hash;
  d["hostname"] = r.hostname;
  d["gpu_uuid"] = r.gpu_uuid;
  d["pci_bus_id"] = r.pci_bus_id;
  d["gpu_index"] = r.gpu_index;
  d["pid"] = r.pid;
  d["cuda_visible_devices"] = r.cuda_visible_devices ? py::object(py::str(*r.cuda_visible_devices)) : py::object(py::none());
  d["visible_device_count"] = r.visible_device_count;
  d["launcher"] = r.launcher;
  d["multi_rank_gpu_enabled"] = r.multi_rank_gpu_enabled;
  d["failure_kind"] = r.failure_kind ? py::object(py::str(*r.failure_kind)) : py::object(py::none());
  d["failure_text"] = r.failure_text;
  d["gpu_fraction"] = r.gpu_fraction ? py::object(py::float_(*r.gpu_fraction)) : py::object(py::none());
  d["ray_gpu_ids"] = r.ray_gpu_ids;
  return d;
}

void bind_identity_placement(py::module_& m) {
  m.def("host_fingerprint", [] {
    auto fp = gpuguard::host_fingerprint();
    py::dict d;
    d["hostname"] = fp.hostname;
    d["hash"] = fp.hash;
    d["from_nccl_hostid"] = fp.from_nccl_hostid;
    return d;
  }, "This host as NCCL identifies it: hostname + boot id (or $NCCL_HOSTID), hashed with NCCL's DJB2a.");

  m.def("encode_identity", [](const py::dict& fields) {
    auto bytes = gpuguard::encode_identity(record_from_dict(fields));
    if (!bytes) throw py::value_error(bytes.error().message());
    return py::bytes(bytes.value());
  }, "Encodes an identity record (dict of IdentityRecord fields); ValueError naming the bad field.");

  m.def("decode_identity", [](const py::bytes& data) {
    auto r = gpuguard::decode_identity(std::string_view(data));
    if (!r) throw py::value_error(r.error().message());
    return record_to_dict(r.value());
  }, "Strictly decodes a peer's identity record; ValueError saying what is malformed.");

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
          auto report = gpuguard::analyze_placement(records, ctx);
          py::dict out;
          out["severity"] = report.severity_name();
          out["message"] = report.message;
          out["shared_devices_total"] = report.shared_devices_total;
          out["ranks_sharing_total"] = report.ranks_sharing_total;
          py::list causes;
          for (auto c : report.causes) causes.append(gpuguard::placement_cause_name(c));
          out["causes"] = causes;
          py::list shared;
          for (const auto& d : report.shared) {
            py::dict sd;
            sd["group"] = d.group;
            sd["gpu_uuid"] = d.gpu_uuid;
            sd["pci_bus_id"] = d.pci_bus_id;
            sd["total_ranks"] = d.total_ranks;
            sd["warning_only"] = d.warning_only;
            py::list ranks, hosts;
            for (const auto& r : d.ranks) {
              ranks.append(r.rank);
              hosts.append(r.hostname);
            }
            sd["ranks"] = ranks;
            sd["hosts"] = hosts;
            py::list dc;
            for (auto c : d.causes) dc.append(gpuguard::placement_cause_name(c));
            sd["causes"] = dc;
            shared.append(sd);
          }
          out["shared"] = shared;
          return out;
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
    py::dict out;
    out["loaded"] = st.loaded;
    out["already_in_process"] = st.already_in_process;
    out["library"] = st.library;
    out["version"] = st.version;
    out["version_string"] = st.version_string;
    out["reason"] = st.reason;
    return out;
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
    py::dict d;
    d["verdict"] = out.verdict_name();
    d["ok"] = out.ok();
    d["stage"] = out.stage;
    d["error"] = out.ok() ? py::object(py::none()) : py::object(error_to_dict(out.error));
    d["last_error"] = out.last_error;
    d["aborted"] = out.aborted;
    d["elapsed_s"] = out.elapsed_s;
    d["init_s"] = out.init_s;
    d["all_reduce_result"] = out.all_reduce_result;
    d["nccl_version"] = out.nccl_version;
    d["library"] = out.library;
    return d;
  }, py::arg("nranks"), py::arg("rank"), py::arg("unique_id"), py::arg("device"), py::arg("timeout_s"),
     py::arg("all_reduce") = false,
     "One rank's part in forming an NCCL communicator (non-blocking init under a deadline, abort on timeout) "
     "and, with all_reduce=True, one small float32 sum checked for the right result. Never raises for NCCL "
     "failures: the dict says what happened (verdict 'ok' | 'failed' | 'timed out', stage, error, last_error).");
}


// ---- diagnostics (issue: doctor/explain) ------------------------------------------------------------------

void bind_diagnostics(py::module_& m) {
  m.def("peer_copy_probe", [](int src, int dst, std::size_t bytes) -> py::dict {
    gpuguard::Result<gpuguard::PeerCopyResult> r = gpuguard::Error{};
    {
      py::gil_scoped_release nogil;  // a broken driver may block here; the caller runs it under a deadline
      r = gpuguard::peer_copy_probe(src, dst, bytes);
    }
    py::dict out;
    out["src"] = src;
    out["dst"] = dst;
    out["bytes"] = bytes;
    if (!r) {
      out["error"] = error_to_dict(r.error());
      return out;
    }
    const auto& v = r.value();
    out["error"] = py::none();
    out["peer_access_reported"] = v.peer_access_reported;
    out["peer_access_enabled"] = v.peer_access_enabled;
    out["verified"] = v.verified;
    out["mismatched_bytes"] = v.mismatched_bytes;
    out["first_mismatch"] = v.mismatched_bytes ? py::object(py::int_(v.first_mismatch)) : py::object(py::none());
    out["destination_unchanged"] = v.destination_unchanged;
    out["copy_milliseconds"] = v.copy_milliseconds;
    return out;
  }, py::arg("src"), py::arg("dst"), py::arg("bytes"),
     "Copies `bytes` from visible device src to dst (peer access enabled where offered) and verifies them.");
}


}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpuguard's compiled core (private; use the gpuguard package)";
  bind_cuda_driver(m);
  bind_nccl(m);
  bind_diagnostics(m);
  bind_binding(m);
  bind_tensor_devices(m);
  bind_identity_placement(m);
}
