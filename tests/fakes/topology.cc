// Parsing and validation of the fake topology JSON.
#include "topology.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "json_lite.h"

namespace gpuguard_fake {

namespace {

void parse_uuid(FakeGpu& gpu, const char* prefix = "GPU-") {
  std::string hex;
  std::string body = gpu.uuid.rfind(prefix, 0) == 0 ? gpu.uuid.substr(4) : gpu.uuid;
  for (char c : body) {
    if (c == '-') continue;
    if (!isxdigit(static_cast<unsigned char>(c))) throw std::runtime_error("uuid " + gpu.uuid + " is not hex");
    hex += static_cast<char>(tolower(static_cast<unsigned char>(c)));
  }
  if (hex.size() != 32) throw std::runtime_error("uuid " + gpu.uuid + " must have 32 hex digits");
  for (int i = 0; i < 16; ++i) {
    gpu.uuid_bytes[i] = static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  char canonical[64];
  const unsigned char* b = gpu.uuid_bytes;
  std::snprintf(canonical, sizeof(canonical),
                "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  gpu.uuid = canonical;
}

void parse_bus_id(FakeGpu& gpu) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  int used = 0;
  if (std::sscanf(gpu.pci_bus_id.c_str(), "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &used) != 4 ||
      used != static_cast<int>(gpu.pci_bus_id.size())) {
    throw std::runtime_error("pci_bus_id " + gpu.pci_bus_id + " must look like 0000:18:00.0");
  }
  gpu.pci_domain = static_cast<int>(domain);
  gpu.pci_bus = static_cast<int>(bus);
  gpu.pci_device = static_cast<int>(device);
}

std::vector<FakeProcess> parse_processes(const Json& gpu) {
  std::vector<FakeProcess> out;
  if (!gpu.has("processes")) return out;
  const Json& list = gpu.at("processes");
  if (list.kind != Json::Kind::Array) throw std::runtime_error("gpus[].processes must be an array");
  for (const Json& p : list.array) {
    FakeProcess process;
    long long pid = p.at("pid").as_int("gpus[].processes[].pid");
    if (pid <= 0 || pid > 0x3fffffff) throw std::runtime_error("gpus[].processes[].pid must be a positive pid");
    process.pid = static_cast<unsigned int>(pid);
    process.used_mib = p.at("used_mib").as_int("gpus[].processes[].used_mib");
    if (process.used_mib < -1) throw std::runtime_error("gpus[].processes[].used_mib must be >= 0, or -1");
    out.push_back(process);
  }
  return out;
}

}  // namespace

std::string gpu_state_dir() {
  const char* dir = std::getenv("GPUGUARD_FAKE_GPU_STATE_DIR");
  return dir != nullptr ? std::string(dir) : std::string();
}

Topology parse_topology(const std::string& text) {
  Json root = parse_json(text);
  Topology topo;
  if (root.has("driver_version")) topo.driver_version = static_cast<int>(root.at("driver_version").as_int("driver_version"));
  const Json& gpus = root.at("gpus");
  if (gpus.kind != Json::Kind::Array) throw std::runtime_error("\"gpus\" must be an array");
  for (size_t i = 0; i < gpus.array.size(); ++i) {
    const Json& g = gpus.array[i];
    FakeGpu gpu;
    gpu.name = g.at("name").as_string("gpus[].name");
    gpu.uuid = g.at("uuid").as_string("gpus[].uuid");
    parse_uuid(gpu);
    gpu.pci_bus_id = g.at("pci_bus_id").as_string("gpus[].pci_bus_id");
    parse_bus_id(gpu);
    gpu.memory_mib = g.has("memory_mib") ? g.at("memory_mib").as_int("gpus[].memory_mib") : 81559;
    if (g.has("compute_capability")) {
      const Json& cc = g.at("compute_capability");
      if (cc.kind != Json::Kind::Array || cc.array.size() != 2) {
        throw std::runtime_error("gpus[].compute_capability must be [major, minor]");
      }
      gpu.cc_major = static_cast<int>(cc.array[0].as_int("compute_capability[0]"));
      gpu.cc_minor = static_cast<int>(cc.array[1].as_int("compute_capability[1]"));
    } else {
      gpu.cc_major = 9;
    }
    gpu.multiprocessors = g.has("multiprocessors") ? static_cast<int>(g.at("multiprocessors").as_int("multiprocessors")) : 132;
    gpu.processes = parse_processes(g);
    if (g.has("mig")) {
      const Json& instances = g.at("mig");
      if (instances.kind != Json::Kind::Array || instances.array.empty()) {
        throw std::runtime_error("gpus[].mig must be a non-empty array of MIG instances");
      }
      for (const Json& m : instances.array) {
        FakeGpu inst;
        inst.is_mig = true;
        inst.uuid = m.at("uuid").as_string("gpus[].mig[].uuid");
        if (inst.uuid.rfind("MIG-", 0) != 0) throw std::runtime_error("MIG uuid " + inst.uuid + " must start with MIG-");
        parse_uuid(inst, "MIG-");
        const std::string profile = m.at("profile").as_string("gpus[].mig[].profile");
        inst.name = gpu.name + " MIG " + profile;  // what cuDeviceGetName reports for a MIG device
        inst.pci_bus_id = gpu.pci_bus_id;
        inst.pci_domain = gpu.pci_domain;
        inst.pci_bus = gpu.pci_bus;
        inst.pci_device = gpu.pci_device;
        inst.memory_mib = m.has("memory_mib") ? m.at("memory_mib").as_int("gpus[].mig[].memory_mib") : 9856;
        inst.cc_major = gpu.cc_major;
        inst.cc_minor = gpu.cc_minor;
        inst.multiprocessors =
            m.has("multiprocessors") ? static_cast<int>(m.at("multiprocessors").as_int("multiprocessors")) : 16;
        std::memcpy(inst.parent_uuid_bytes, gpu.uuid_bytes, 16);
        inst.processes = parse_processes(m);
        for (const auto& other : gpu.mig) {
          if (other.uuid == inst.uuid) throw std::runtime_error("two MIG instances share uuid " + inst.uuid);
        }
        gpu.mig.push_back(inst);
      }
    }
    for (const auto& other : topo.gpus) {
      if (other.uuid == gpu.uuid) throw std::runtime_error("two gpus share uuid " + gpu.uuid);
      for (const auto& a : other.mig) {
        for (const auto& b : gpu.mig) {
          if (a.uuid == b.uuid) throw std::runtime_error("two MIG instances share uuid " + a.uuid);
        }
      }
    }
    topo.gpus.push_back(gpu);
  }
  size_t n = topo.gpus.size();
  topo.peer_access.assign(n, std::vector<bool>(n, true));
  if (root.has("peer_access")) {
    const Json& m = root.at("peer_access");
    if (m.kind != Json::Kind::Array || m.array.size() != n) {
      throw std::runtime_error("peer_access must be an N x N array of booleans (N = number of gpus)");
    }
    for (size_t i = 0; i < n; ++i) {
      if (m.array[i].kind != Json::Kind::Array || m.array[i].array.size() != n) {
        throw std::runtime_error("peer_access row " + std::to_string(i) + " must have " + std::to_string(n) + " entries");
      }
      for (size_t j = 0; j < n; ++j) topo.peer_access[i][j] = m.array[i].array[j].as_bool("peer_access[i][j]");
    }
  }
  if (root.has("peer_copy_drops_writes")) topo.peer_copy_drops_writes = root.at("peer_copy_drops_writes").as_bool("peer_copy_drops_writes");
  if (root.has("nccl")) {
    const Json& nccl = root.at("nccl");
    if (nccl.has("version")) topo.nccl_version = static_cast<int>(nccl.at("version").as_int("nccl.version"));
    if (nccl.has("behavior")) topo.nccl_behavior = nccl.at("behavior").as_string("nccl.behavior");
    const std::string& b = topo.nccl_behavior;
    if (b != "ok" && b != "duplicate" && b != "hang" && b != "hang_unless_p2p_disabled" && b != "hang_all_reduce") {
      throw std::runtime_error("nccl.behavior must be ok, duplicate, hang, hang_unless_p2p_disabled or "
                               "hang_all_reduce, not " + b);
    }
  }
  if (root.has("context_mib")) topo.context_mib = root.at("context_mib").as_int("context_mib");
  if (root.has("nvml")) {
    const Json& nvml = root.at("nvml");
    if (nvml.has("reserved_mib")) topo.nvml_reserved_mib = nvml.at("reserved_mib").as_int("nvml.reserved_mib");
    if (nvml.has("driver_version")) topo.nvml_driver_version = nvml.at("driver_version").as_string("nvml.driver_version");
  }
  if (topo.context_mib < 0 || topo.nvml_reserved_mib < 0) {
    throw std::runtime_error("context_mib and nvml.reserved_mib must not be negative");
  }
  return topo;
}

Topology load_topology() {
  const char* raw = std::getenv("GPUGUARD_FAKE_TOPOLOGY");
  if (raw == nullptr || raw[0] == '\0') throw std::runtime_error("GPUGUARD_FAKE_TOPOLOGY is not set");
  // "%h" stands for this host's name, so that every node of a test cluster (its own UTS namespace) reads its
  // own topology from one exported path: GPUGUARD_FAKE_TOPOLOGY=/tmp/cluster/topology/%h.json
  std::string path = raw;
  if (std::string::size_type at = path.find("%h"); at != std::string::npos) {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
    path.replace(at, 2, host);
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    return parse_topology(buf.str());
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace gpuguard_fake
