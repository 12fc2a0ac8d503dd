// Finds the ranks of one group that share a GPU, works out why, and writes the report every rank raises.
#include "gpuguard/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <tuple>
#include <utility>

namespace gpuguard {

namespace {

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string join_ranks(const std::vector<const IdentityRecord*>& rs, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < rs.size() && i < limit; ++i) {
    if (i > 0) out += (i + 1 == rs.size() && rs.size() <= limit) ? " and " : ", ";
    out += std::to_string(rs[i]->rank);
  }
  if (rs.size() > limit) out += " and " + std::to_string(rs.size() - limit) + " more";
  return out;
}

bool is_mig(const IdentityRecord& r) { return r.gpu_uuid.rfind("MIG-", 0) == 0; }

std::string host_label(const IdentityRecord& r) { return r.hostname.empty() ? "an unnamed host" : r.hostname; }

std::string visible_label(const IdentityRecord& r) {
  if (!r.cuda_visible_devices) return "CUDA_VISIBLE_DEVICES unset";
  return "CUDA_VISIBLE_DEVICES=" + (r.cuda_visible_devices->empty() ? std::string("''") : *r.cuda_visible_devices);
}

std::string fraction_label(double f) {
  // 1/3 reads better than 0.333 for the fractions Ray users write. Ray keeps resource amounts to 4 decimals
  // (num_gpus=1/3 comes back from get_assigned_resources() as 0.3333), so allow that rounding, times d.
  for (int d = 2; d <= 16; ++d) {
    if (std::fabs(f * d - 1.0) <= 0.5e-4 * d + 1e-9) return "1/" + std::to_string(d);
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", f);
  return buf;
}

struct CauseText {
  PlacementCause cause;
  std::string why;
  std::string fix;
};

class Analyzer {
 public:
  Analyzer(const std::vector<IdentityRecord>& records, const PlacementContext& ctx) : records_(records), ctx_(ctx) {}

  PlacementReport run() {
    PlacementReport report;
    // (group, uuid) -> records. Sharing across groups is allowed (colocated roles); within a group it is not.
    std::map<std::pair<std::string, std::string>, std::vector<const IdentityRecord*>> by_device;
    // (group, host, PCI bus id) -> ranks on MIG instances of that GPU
    std::map<std::tuple<std::string, std::uint64_t, std::string>, std::vector<const IdentityRecord*>> by_gpu;
    std::set<std::pair<std::string, int>> seen;  // the exchange may hand a record over twice
    for (const auto& r : records_) {
      if (r.gpu_uuid.empty() || r.failure_kind) continue;
      if (!seen.insert({r.group, r.rank}).second) continue;
      by_device[{r.group, r.gpu_uuid}].push_back(&r);
      if (is_mig(r) && !r.pci_bus_id.empty()) by_gpu[{r.group, r.host_hash, r.pci_bus_id}].push_back(&r);
      host_counts_[{r.group, r.host_hash}] += 1;
    }
    std::vector<std::pair<SharedDevice, std::vector<CauseText>>> found;
    for (auto& [key, rs] : by_device) {
      int total = static_cast<int>(rs.size());
      auto t = ctx_.device_rank_totals.find(key.second);
      if (t != ctx_.device_rank_totals.end()) total = std::max(total, t->second);
      if (total < 2) continue;
      std::sort(rs.begin(), rs.end(), [](const IdentityRecord* a, const IdentityRecord* b) { return a->rank < b->rank; });
      SharedDevice d;
      d.group = key.first;
      d.gpu_uuid = key.second;
      for (const auto* r : rs) {
        if (d.pci_bus_id.empty()) d.pci_bus_id = r->pci_bus_id;
      }
      d.total_ranks = total;
      for (const auto* r : rs) d.ranks.push_back(*r);
      std::vector<CauseText> causes = explain(rs, d.group);
      for (const auto& c : causes) d.causes.push_back(c.cause);
      found.emplace_back(std::move(d), std::move(causes));
    }
    for (auto& [key, rs] : by_gpu) {
      std::set<std::string> instances;
      for (const auto* r : rs) instances.insert(r->gpu_uuid);
      if (instances.size() < 2) continue;
      std::sort(rs.begin(), rs.end(), [](const IdentityRecord* a, const IdentityRecord* b) { return a->rank < b->rank; });
      SharedDevice d;
      d.group = std::get<0>(key);
      d.pci_bus_id = std::get<2>(key);
      d.total_ranks = static_cast<int>(rs.size());
      d.warning_only = true;
      for (const auto* r : rs) d.ranks.push_back(*r);
      d.causes.push_back(PlacementCause::kMigInstancesOfOneGpu);
      std::vector<CauseText> causes{{PlacementCause::kMigInstancesOfOneGpu,
                                     "ranks " + join_ranks(rs) + " are on " + std::to_string(instances.size()) +
                                         " different MIG instances of the GPU at PCI " + d.pci_bus_id + " on " +
                                         host_label(*rs.front()) +
                                         ": separate devices to CUDA, but one GPU to NCCL, which compares the PCI "
                                         "bus id (2.29 and earlier) or the GPU's UUID (2.30 and later)",
                                     "with NCCL 2.30 or later set NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank (safe "
                                     "here: the instances are separate, and gpuguard still stops ranks that share "
                                     "one instance); with NCCL 2.29 or earlier, which has no such switch, upgrade "
                                     "NCCL, or give each rank a MIG instance on a different GPU (or a whole GPU)"}};
      found.emplace_back(std::move(d), std::move(causes));
    }
    if (found.empty()) return report;
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      return a.first.ranks.front().rank < b.first.ranks.front().rank;
    });
    bool any_error = false;
    for (const auto& f : found) any_error = any_error || !f.first.warning_only;
    report.severity = any_error ? PlacementReport::Severity::kError : PlacementReport::Severity::kWarning;
    // The totals count what the severity is about: shared devices in an error, MIG-split GPUs in a warning.
    int counted_devices = 0;
    for (const auto& f : found) {
      if (f.first.warning_only != any_error) {
        ++counted_devices;
        report.ranks_sharing_total += f.first.total_ranks;
      }
    }
    report.shared_devices_total = any_error ? std::max(counted_devices, ctx_.shared_devices_total) : counted_devices;
    if (any_error) report.ranks_sharing_total = std::max(report.ranks_sharing_total, ctx_.ranks_sharing_total);
    for (const auto& f : found) {
      for (auto c : f.first.causes) {
        if (std::find(report.causes.begin(), report.causes.end(), c) == report.causes.end()) report.causes.push_back(c);
      }
    }
    report.message = write(found, report);
    for (auto& f : found) report.shared.push_back(std::move(f.first));
    return report;
  }

 private:
  int host_total(const std::string& group, const IdentityRecord& r) const {
    auto t = ctx_.host_rank_totals.find(r.host_hash);
    int counted = 0;
    auto c = host_counts_.find({group, r.host_hash});
    if (c != host_counts_.end()) counted = c->second;
    return t != ctx_.host_rank_totals.end() ? std::max(t->second, counted) : counted;
  }

  std::vector<CauseText> explain(const std::vector<const IdentityRecord*>& rs, const std::string& group) const {
    std::vector<CauseText> out;
    const IdentityRecord& first = *rs.front();

    std::set<std::uint64_t> hosts;
    for (const auto* r : rs) hosts.insert(r->host_hash);
    if (hosts.size() > 1) {
      std::set<std::string> names;
      for (const auto* r : rs) names.insert(host_label(*r));
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      out.push_back({PlacementCause::kContainersShareGpu,
                     "ranks " + join_ranks(rs) + " report different hosts (" + list +
                         ") but the same GPU: containers (or VMs) on one machine were given the same GPU. NCCL "
                         "sees different hosts here and will not notice; the job hangs or runs out of memory instead",
                     "give each container its own GPU (docker --gpus device=N, or the device plugin's per-pod "
                     "allocation), or run the ranks in one container"});
    }

    bool fractional = false;
    double fraction = 1;
    for (const auto* r : rs) {
      if (r->gpu_fraction && *r->gpu_fraction < 1.0) {
        fractional = true;
        fraction = *r->gpu_fraction;
      }
    }
    // Ray packed them only if it gave them the same GPU: ranks Ray gave different GPUs that still share one did
    // not get there through their shares (CUDA initialised before Ray set CUDA_VISIBLE_DEVICES, for one)
    fractional = fractional && std::all_of(rs.begin(), rs.end(), [&](const IdentityRecord* r) {
      return r->ray_gpu_ids == first.ray_gpu_ids;
    });
    if (fractional) {
      out.push_back({PlacementCause::kFractionalRayGpus,
                     "Ray gave these actors " + fraction_label(fraction) + " of a GPU each (num_gpus=" +
                         fraction_label(fraction) + ") and the same GPU" +
                         (first.ray_gpu_ids.empty() ? "" : " (Ray GPU ids " + first.ray_gpu_ids + ")") + ", so " +
                         std::to_string(rs.size()) + " ranks of group '" + group + "' share it",
                     "give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1), or any "
                     "placement group with one {\"GPU\": 1} bundle per rank (verl's RayResourcePool has one; its "
                     "max_colocate_count lets only other worker groups share a rank's GPU, so lowering it does not "
                     "help there); roles that are meant to share GPUs belong in different groups (bind(group=...)). "
                     "If every rank already has a bundle of its own, two Ray nodes on " + host_label(first) +
                         " offer the same GPUs: run one Ray node per host, with only that host's GPUs"});
    }

    bool same_cvd = !fractional && std::all_of(rs.begin(), rs.end(), [&](const IdentityRecord* r) {
      return r->cuda_visible_devices && !r->cuda_visible_devices->empty() &&
             *r->cuda_visible_devices == *first.cuda_visible_devices;
    });
    if (same_cvd && is_mig(first)) {
      // a process sees one MIG device, so neither $LOCAL_RANK nor bind() can pick another: the variable must
      out.push_back({PlacementCause::kSameVisibleDevices,
                     "every rank on it was given CUDA_VISIBLE_DEVICES=" + *first.cuda_visible_devices +
                         ", so each got the same MIG instance",
                     "give each rank its own MIG instance: a different CUDA_VISIBLE_DEVICES=MIG-<uuid> per process "
                     "(nvidia-smi -L lists them), or your scheduler's per-task GPU binding on MIG devices (e.g. "
                     "srun --gpus-per-task=1 with MIG in gres.conf)"});
    } else if (same_cvd && !first.ray_gpu_ids.empty() && hosts.size() == 1) {
      // Ray gave each rank a whole GPU (a fraction is the case above) and still the same one: one raylet never
      // hands a GPU to two whole-GPU requests, so two raylets on this host offer the same GPUs
      out.push_back({PlacementCause::kSameVisibleDevices,
                     "Ray gave every rank on it the same GPU (Ray GPU ids " + first.ray_gpu_ids +
                         ", CUDA_VISIBLE_DEVICES=" + *first.cuda_visible_devices + "), a whole GPU each: one Ray "
                         "node never does that, so two Ray nodes on " + host_label(first) + " offer the same GPUs "
                         "(`ray start` run twice on one host, or two Ray containers or pods that each see all of its "
                         "GPUs)",
                     "run one Ray node per host, with only that host's GPUs (in Kubernetes, give each Ray pod its "
                     "own GPUs through nvidia.com/gpu limits; elsewhere CUDA_VISIBLE_DEVICES before `ray start`)"});
    } else if (same_cvd) {
      out.push_back({PlacementCause::kSameVisibleDevices,
                     "every rank on it was given CUDA_VISIBLE_DEVICES=" + *first.cuda_visible_devices +
                         ", so each picked the same GPU",
                     std::string("give each rank its own GPU: CUDA_VISIBLE_DEVICES=$LOCAL_RANK per process (or your "
                     "scheduler's per-task GPU binding, e.g. srun --gpus-per-task=1), or leave "
                     "CUDA_VISIBLE_DEVICES unset and let gpuguard.bind() choose by local rank") +
                         (first.visible_device_count == 1
                              ? "; if the host has only one GPU, run one process of the group on it (two ranks "
                                "of one NCCL group cannot share a GPU)"
                              : "")});
    }

    // Per host: more ranks of this group than GPUs the host shows (only meaningful where the ranks see
    // the whole host, i.e. CUDA_VISIBLE_DEVICES is unset).
    bool global_as_local = false;
    std::set<std::uint64_t> explained_hosts;
    for (const auto* r : rs) {
      if (explained_hosts.count(r->host_hash) != 0) continue;
      std::vector<const IdentityRecord*> on_host;
      for (const auto* o : rs) if (o->host_hash == r->host_hash) on_host.push_back(o);
      const int gpus = r->visible_device_count;
      const int host_ranks = host_total(group, *r);
      // Global rank used as local rank: local rank equals the global rank beyond what the host has GPUs
      // for, in a job that spans other hosts too.
      bool looks_global = gpus > 0 && r->world_size > host_ranks &&
                          std::all_of(on_host.begin(), on_host.end(), [&](const IdentityRecord* o) {
                            return o->local_rank == o->rank;
                          }) &&
                          std::any_of(on_host.begin(), on_host.end(), [&](const IdentityRecord* o) {
                            return o->local_rank >= gpus;
                          });
      if (looks_global) {
        global_as_local = true;
        explained_hosts.insert(r->host_hash);
        out.push_back({PlacementCause::kGlobalRankAsLocal,
                       "on " + host_label(*r) + ", ranks " + join_ranks(on_host) +
                           " have a local rank equal to their global rank, but that host shows " +
                           plural(gpus, "GPU", "GPUs") +
                           ": the global rank was used as the local rank (local ranks restart at 0 on every node), "
                           "and wrapping it onto the GPUs put several ranks on one",
                       "take the local rank from the launcher (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK), "
                       "never the global RANK; gpuguard.bind() does this"});
        continue;
      }
      bool whole_host_visible = std::all_of(on_host.begin(), on_host.end(), [](const IdentityRecord* o) {
        return !o->cuda_visible_devices;
      });
      if (!same_cvd && !fractional && whole_host_visible && gpus > 0 && host_ranks > gpus) {
        explained_hosts.insert(r->host_hash);
        out.push_back({PlacementCause::kMoreRanksThanGpus,
                       std::to_string(host_ranks) + " processes on a host with " + plural(gpus, "GPU", "GPUs") + " (" +
                           host_label(*r) + " runs " + std::to_string(host_ranks) + " ranks of group '" + group +
                           "' and shows " + plural(gpus, "GPU", "GPUs") + ")",
                       "start at most " + std::to_string(gpus) + " process" + (gpus == 1 ? "" : "es") + " on " +
                           host_label(*r) + " (torchrun --nproc_per_node=" + std::to_string(gpus) +
                           "), or run on hosts with at least " + std::to_string(host_ranks) + " GPUs"});
      }
    }

    // Several launcher agents on one host (srun -n 2 torchrun --nproc_per_node 2 on one node): each agent
    // says its host runs local_world_size ranks and numbers them from 0, but the host runs more, so the
    // ranks with equal local ranks meet on one GPU. The device was set; the agents overlap.
    bool agents_overlap = false;
    if (!same_cvd && !fractional && !global_as_local && hosts.size() == 1) {
      const int lws = first.local_world_size;
      const int host_ranks = host_total(group, first);
      const bool same_local = std::all_of(rs.begin(), rs.end(), [&](const IdentityRecord* r) {
        return r->local_rank >= 0 && r->local_rank == first.local_rank && r->local_world_size == lws;
      });
      if (same_local && lws > 0 && host_ranks > lws) {
        agents_overlap = true;
        const int agents = (host_ranks + lws - 1) / lws;
        out.push_back({PlacementCause::kLaunchersShareHost,
                       std::to_string(agents) + " launcher agents on one host: " + host_label(first) + " runs " +
                           std::to_string(host_ranks) + " ranks of group '" + group + "', but each agent counts " +
                           "only its own " + std::to_string(lws) + " (local world size " + std::to_string(lws) +
                           ") and numbers them from 0, so ranks " + join_ranks(rs) + " all have local rank " +
                           std::to_string(first.local_rank) + " and its GPU",
                       "start one launcher agent per host (srun --ntasks-per-node=1 torchrun --nproc_per_node=<GPUs "
                       "per host> ..., or mpirun --npernode 1 ...), or give each agent its own GPUs "
                       "(CUDA_VISIBLE_DEVICES per agent)"});
      }
    }

    bool all_zero = std::all_of(rs.begin(), rs.end(), [](const IdentityRecord* r) {
      return r->gpu_index == 0 && r->visible_device_count > 1;
    });
    if (all_zero && !same_cvd && !fractional && !global_as_local && !agents_overlap) {
      out.push_back({PlacementCause::kAllOnDeviceZero,
                     "every rank on it uses cuda:0 although " + host_label(first) + " shows " +
                         plural(first.visible_device_count, "GPU", "GPUs") +
                         ": the device was never set per rank (no torch.cuda.set_device(local_rank) before the "
                         "first CUDA call, or device=\"cuda\" everywhere)",
                     "call gpuguard.bind() (or torch.cuda.set_device(local_rank)) at the start of every rank, before "
                     "any CUDA work"});
    }
    return out;
  }

  std::string rank_line(const IdentityRecord& r) const {
    std::string line = "    rank " + std::to_string(r.rank) + ": host " + host_label(r) + ", cuda:" +
                       std::to_string(r.gpu_index) + ", local rank " +
                       (r.local_rank >= 0 ? std::to_string(r.local_rank) : std::string("unknown")) + ", pid " +
                       std::to_string(r.pid) + ", " + visible_label(r);
    if (is_mig(r) && r.cuda_visible_devices.value_or("") != r.gpu_uuid) line += ", " + r.gpu_uuid;
    if (r.gpu_fraction) line += ", Ray num_gpus=" + fraction_label(*r.gpu_fraction);
    if (!r.launcher.empty()) line += ", launcher " + r.launcher;
    return line + "\n";
  }

  std::string write(const std::vector<std::pair<SharedDevice, std::vector<CauseText>>>& found,
                    const PlacementReport& report) const {
    const int ranks_sharing = report.ranks_sharing_total;
    std::set<std::string> groups;
    for (const auto& f : found) groups.insert(f.first.group);
    std::string group_text;
    for (const auto& g : groups) group_text += (group_text.empty() ? "'" : ", '") + g + "'";
    std::string out;
    const bool warning = report.severity == PlacementReport::Severity::kWarning;
    bool any_mig = false, all_multi_rank = true;
    for (const auto& f : found) {
      if (f.first.warning_only) continue;
      any_mig = any_mig || is_mig(f.first.ranks.front());
      for (const auto& r : f.first.ranks) all_multi_rank = all_multi_rank && r.multi_rank_gpu_enabled;
    }
    if (warning) {
      bool split_multi_rank = true;
      for (const auto& f : found) {
        for (const auto& r : f.first.ranks) split_multi_rank = split_multi_rank && r.multi_rank_gpu_enabled;
      }
      // NCCL >= 2.30 compares cuDeviceGetUuid loaded at CUDA 9.2's ABI (src/misc/cudawrap.cc:
      // LOAD_SYM(cuDeviceGetUuid, 9020)), the legacy entry point, which gives a MIG device its GPU's UUID.
      out += std::to_string(ranks_sharing) + " ranks of group " + group_text + " are on different MIG instances of " +
             plural(report.shared_devices_total, "GPU", "GPUs") + ": each has a device of its own, so gpuguard lets "
             "the job continue. ";
      out += split_multi_rank
                 ? "NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved, so NCCL 2.30 and later accept them; "
                   "NCCL 2.29 and earlier, which have no such switch, stop them with \"Duplicate GPU detected : rank A "
                   "and rank B both on CUDA device <bus id>\".\n"
                 : "NCCL will not: it sees one GPU (2.30 and later compare the GPU's UUID, which every instance "
                   "reports to it, and stop with \"Multiple Ranks are using the same GPU/Partition\" unless "
                   "NCCL_MULTI_RANK_GPU_ENABLE=1; 2.29 and earlier compare the PCI bus id and stop with \"Duplicate "
                   "GPU detected\").\n";
    } else {
      out += std::to_string(ranks_sharing) + " ranks of group " + group_text + " share " +
             plural(report.shared_devices_total, any_mig ? "device" : "GPU", any_mig ? "devices" : "GPUs") +
             (any_mig ? " (a GPU or one MIG instance)" : "") + ".";
      if (all_multi_rank) {
        // The job's NCCL may be older than the switch (the lent GPU's torch 2.11 ships NCCL 2.28.9): say which
        // versions it silences, and what the others do.
        out += " NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved: it turns off the check of NCCL 2.30 "
               "and later (\"Multiple Ranks are using the same GPU/Partition\"), so with those nothing else would "
               "stop them and they would split one device's memory and compute (NCCL 2.29 and earlier, which have "
               "no such switch, stop them with \"Duplicate GPU detected\"); gpuguard stops every rank all the "
               "same. That variable is right only for ranks meant to share a device, and those belong in different "
               "gpuguard groups (bind(group=...)), which may share.\n";
      } else {
        out += " NCCL would stop them with \"Duplicate GPU detected\" (NCCL 2.30+: \"Multiple Ranks are using the "
               "same GPU/Partition\"; NCCL_MULTI_RANK_GPU_ENABLE=1 would silence that, not fix it) or hang; gpuguard "
               "stopped every rank before that.\n";
      }
    }
    int listed = 0;
    for (const auto& [d, causes] : found) {
      if (listed == kReportMaxDevices) break;
      ++listed;
      std::vector<const IdentityRecord*> rs;
      for (const auto& r : d.ranks) rs.push_back(&r);
      const std::string pci = d.pci_bus_id.empty() ? std::string("unknown") : d.pci_bus_id;
      if (d.warning_only) {
        out += "\n  GPU at PCI " + pci + " on " + host_label(d.ranks.front()) + " is split into MIG instances used by "
               "ranks " + join_ranks(rs) + (groups.size() > 1 ? " of group '" + d.group + "'" : std::string()) +
               (warning ? "" : " [different instances: allowed]") + ":\n";
      } else {
        out += "\n  " + (is_mig(d.ranks.front()) ? "MIG instance " + d.gpu_uuid + " of the GPU at PCI " + pci
                                                 : "GPU " + d.gpu_uuid + " (PCI " + pci + ")") +
               " is shared by ranks " + join_ranks(rs) +
               (d.total_ranks > static_cast<int>(d.ranks.size())
                    ? " (" + std::to_string(d.total_ranks) + " ranks in all)"
                    : std::string()) +
               (groups.size() > 1 ? " of group '" + d.group + "'" : std::string()) + ":\n";
      }
      int shown = 0;
      for (const auto& r : d.ranks) {
        if (shown == kReportMaxRanksPerDevice) break;
        out += rank_line(r);
        ++shown;
      }
      if (d.total_ranks > shown) out += "    ... and " + std::to_string(d.total_ranks - shown) + " more ranks\n";
    }
    int unlisted = report.shared_devices_total - listed;
    if (unlisted > 0) out += "\n  ... and " + plural(unlisted, "more shared GPU", "more shared GPUs") + "\n";

    // Causes: the first text of each kind, with how many other devices show the same.
    std::vector<std::pair<const CauseText*, int>> kinds;
    for (const auto& f : found) {
      for (const auto& c : f.second) {
        auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first->cause == c.cause; });
        if (it == kinds.end()) kinds.emplace_back(&c, 0);
        else ++it->second;
      }
    }
    bool duplicates_explained = false;  // a MIG-split GPU's note explains nothing about a shared device
    for (const auto& f : found) duplicates_explained = duplicates_explained || (!f.first.warning_only && !f.second.empty());
    if (!warning && !duplicates_explained) {
      out += "\nLikely cause: not recognised; the ranks resolved the same GPU through different settings (compare "
             "their CUDA_VISIBLE_DEVICES and cuda:N above).\nFix: make each rank of the group select a different GPU, "
             "e.g. with gpuguard.bind() at the start of every rank.\n";
    }
    for (const auto& [c, others] : kinds) {
      out += "\nLikely cause: " + c->why;
      if (others > 0) out += " (the same on " + plural(others, "other shared GPU", "other shared GPUs") + ")";
      out += ".\nFix: " + c->fix + ".\n";
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  const std::vector<IdentityRecord>& records_;
  const PlacementContext& ctx_;
  std::map<std::pair<std::string, std::uint64_t>, int> host_counts_;
};

}  // namespace

const char* placement_cause_name(PlacementCause cause) {
  switch (cause) {
    case PlacementCause::kSameVisibleDevices: return "same_cuda_visible_devices";
    case PlacementCause::kAllOnDeviceZero: return "all_on_device_0";
    case PlacementCause::kMoreRanksThanGpus: return "more_ranks_than_gpus";
    case PlacementCause::kFractionalRayGpus: return "fractional_ray_gpus";
    case PlacementCause::kGlobalRankAsLocal: return "global_rank_as_local_rank";
    case PlacementCause::kContainersShareGpu: return "containers_share_gpu";
    case PlacementCause::kLaunchersShareHost: return "launchers_share_host";
    case PlacementCause::kMigInstancesOfOneGpu: return "mig_instances_of_one_gpu";
  }
  return "unknown";
}

const char* PlacementReport::severity_name() const {
  switch (severity) {
    case Severity::kOk: return "ok";
    case Severity::kWarning: return "warning";
    case Severity::kError: return "error";
  }
  return "unknown";
}

PlacementReport analyze_placement(const std::vector<IdentityRecord>& records, const PlacementContext& context) {
  return Analyzer(records, context).run();
}

}  // namespace gpuguard
