// Duplicate-device detection: who shares, which cause the report names, and the report's text.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpuguard/placement.h"

namespace {

using gpuguard::IdentityRecord;
using gpuguard::PlacementCause;
using gpuguard::PlacementReport;

const char* kUuid[] = {"GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60", "GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61",
                       "GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62", "GPU-5a6baf33-0003-4003-8003-1f2e3d4c5b63"};
const char* kPci[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"};

IdentityRecord rank_on(int rank, int world, int physical_gpu, int gpu_index, int visible_count,
                       const std::string& host = "node-a") {
  IdentityRecord r;
  r.rank = rank;
  r.world_size = world;
  r.local_rank = rank;
  r.hostname = host;
  r.host_hash = gpuguard::nccl_string_hash(host);
  r.gpu_uuid = kUuid[physical_gpu];
  r.pci_bus_id = kPci[physical_gpu];
  r.gpu_index = gpu_index;
  r.visible_device_count = visible_count;
  r.pid = 1000 + static_cast<std::uint32_t>(rank);
  r.launcher = "torchrun";
  return r;
}

bool has_cause(const PlacementReport& r, PlacementCause c) {
  return std::find(r.causes.begin(), r.causes.end(), c) != r.causes.end();
}

#define EXPECT_IN(needle, haystack) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace

TEST(Placement, DistinctGpusPass) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 4; ++i) rs.push_back(rank_on(i, 4, i, i, 4));
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_EQ(report.severity, PlacementReport::Severity::kOk);
  EXPECT_TRUE(report.message.empty());
  EXPECT_TRUE(report.shared.empty());
}

TEST(Placement, DifferentGroupsMayShareAGpu) {
  auto actor = rank_on(0, 1, 0, 0, 1);
  actor.group = "actor";
  auto critic = rank_on(0, 1, 0, 0, 1);
  critic.group = "critic";
  EXPECT_EQ(gpuguard::analyze_placement({actor, critic}).severity, PlacementReport::Severity::kOk);
}

TEST(Placement, TwoProcessesOnAOneGpuHost) {
  auto report = gpuguard::analyze_placement({rank_on(0, 2, 0, 0, 1), rank_on(1, 2, 0, 0, 1)});
  ASSERT_EQ(report.severity, PlacementReport::Severity::kError);
  ASSERT_EQ(report.shared.size(), 1u);
  EXPECT_EQ(report.shared[0].total_ranks, 2);
  EXPECT_TRUE(has_cause(report, PlacementCause::kMoreRanksThanGpus));
  EXPECT_FALSE(has_cause(report, PlacementCause::kAllOnDeviceZero));
  const std::string& m = report.message;
  EXPECT_IN("2 ranks of group 'default' share 1 GPU.", m);
  EXPECT_IN("GPU GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60 (PCI 0000:18:00.0) is shared by ranks 0 and 1:", m);
  EXPECT_IN("rank 0: host node-a, cuda:0, local rank 0, pid 1000, CUDA_VISIBLE_DEVICES unset, launcher torchrun", m);
  EXPECT_IN("rank 1: host node-a, cuda:0, local rank 1, pid 1001", m);
  EXPECT_IN("Likely cause: 2 processes on a host with 1 GPU (node-a runs 2 ranks of group 'default' and shows 1 GPU)", m);
  EXPECT_IN("Fix: start at most 1 process on node-a (torchrun --nproc_per_node=1)", m);
  EXPECT_IN("Duplicate GPU detected", m);
}

TEST(Placement, OneVisibleDevicesValueForEveryRank) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 4; ++i) {
    auto r = rank_on(i, 4, 0, 0, 1);
    r.cuda_visible_devices = "0";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  ASSERT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_TRUE(has_cause(report, PlacementCause::kSameVisibleDevices));
  EXPECT_FALSE(has_cause(report, PlacementCause::kMoreRanksThanGpus));  // the host may well have 8 GPUs
  EXPECT_IN("shared by ranks 0, 1, 2 and 3:", report.message);
  EXPECT_IN("Likely cause: every rank on it was given CUDA_VISIBLE_DEVICES=0", report.message);
  EXPECT_IN("CUDA_VISIBLE_DEVICES=$LOCAL_RANK", report.message);
}

TEST(Placement, EveryRankOnDeviceZeroOfAnEightGpuHost) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 3; ++i) rs.push_back(rank_on(i, 3, 0, 0, 8));
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_TRUE(has_cause(report, PlacementCause::kAllOnDeviceZero));
  EXPECT_FALSE(has_cause(report, PlacementCause::kMoreRanksThanGpus));
  EXPECT_IN("every rank on it uses cuda:0 although node-a shows 8 GPUs", report.message);
  EXPECT_IN("torch.cuda.set_device(local_rank)", report.message);
}

TEST(Placement, FractionalRayGpusRecommendMaxColocateOne) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 3; ++i) {
    auto r = rank_on(i, 3, 2, 0, 1);
    r.launcher = "ray";
    r.cuda_visible_devices = "2";
    r.gpu_fraction = 1.0 / 3.0;
    r.ray_gpu_ids = "['2']";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_TRUE(has_cause(report, PlacementCause::kFractionalRayGpus));
  EXPECT_FALSE(has_cause(report, PlacementCause::kSameVisibleDevices));  // Ray set it; the fraction is why
  EXPECT_IN("Ray gave these actors 1/3 of a GPU each (num_gpus=1/3) and the same GPU (Ray GPU ids ['2']), so 3 ranks of group 'default' share it", report.message);
  EXPECT_IN("max_colocate=1", report.message);
  EXPECT_IN("Ray num_gpus=1/3", report.message);
}

// verl 0.9's RayResourcePool gives every rank a bundle of its own ({"GPU": 1}) and each actor 1/max_colocate_count of
// it: a worker group whose ranks still share a GPU was not packed by its share, and the fix says what then is wrong.
TEST(Placement, FractionalRayGpusNameBundlesAndTwoRayNodesNotALowerColocateCount) {
  std::vector<IdentityRecord> rs;
  for (int i : {0, 2}) {  // ranks 0 and 2 of 4, each on Ray GPU 0 of its own Ray node, one host
    auto r = rank_on(i, 4, 0, 0, 1);
    r.launcher = "ray";
    r.cuda_visible_devices = "0";
    r.gpu_fraction = 1.0 / 3.0;
    r.ray_gpu_ids = "0";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_TRUE(has_cause(report, PlacementCause::kFractionalRayGpus));
  EXPECT_IN("one {\"GPU\": 1} bundle per rank (verl's RayResourcePool has one; its max_colocate_count lets only other "
            "worker groups share a rank's GPU, so lowering it does not help there)", report.message);
  EXPECT_IN("If every rank already has a bundle of its own, two Ray nodes on node-a offer the same GPUs: run one Ray "
            "node per host, with only that host's GPUs", report.message);
  EXPECT_EQ(report.message.find("verl: max_colocate_count=1"), std::string::npos);
}

TEST(Placement, RayRanksGivenDifferentGpusAreNotSaidToBePackedByTheirShare) {
  // Ray gave them GPUs 0 and 1, yet both run on GPU 0 (CUDA was initialised before Ray set CUDA_VISIBLE_DEVICES)
  std::vector<IdentityRecord> rs;
  for (int i : {0, 1}) {
    auto r = rank_on(i, 2, 0, 0, 2);
    r.launcher = "ray";
    r.cuda_visible_devices = std::to_string(i);
    r.gpu_fraction = 0.5;
    r.ray_gpu_ids = std::to_string(i);
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_FALSE(has_cause(report, PlacementCause::kFractionalRayGpus));
  EXPECT_EQ(report.message.find("and the same GPU"), std::string::npos);
}

TEST(Placement, WholeRayGpusWithOneIdOnOneHostAreTwoRayNodes) {
  std::vector<IdentityRecord> rs;
  for (int i : {1, 3}) {
    auto r = rank_on(i, 4, 1, 0, 1);
    r.launcher = "ray";
    r.cuda_visible_devices = "1";
    r.gpu_fraction = 1.0;
    r.ray_gpu_ids = "1";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_TRUE(has_cause(report, PlacementCause::kSameVisibleDevices));
  EXPECT_IN("Ray gave every rank on it the same GPU (Ray GPU ids 1, CUDA_VISIBLE_DEVICES=1), a whole GPU each: one "
            "Ray node never does that, so two Ray nodes on node-a offer the same GPUs", report.message);
  EXPECT_IN("run one Ray node per host", report.message);
  EXPECT_EQ(report.message.find("CUDA_VISIBLE_DEVICES=$LOCAL_RANK"), std::string::npos);
}

TEST(Placement, GlobalRankUsedAsLocalRankOnTheSecondNode) {
  // Node b (2 GPUs) runs ranks 2 and 3 of 4 with LOCAL_RANK=$RANK; clamping put both on its last GPU.
  auto a = rank_on(2, 4, 3, 1, 2, "node-b");
  auto b = rank_on(3, 4, 3, 1, 2, "node-b");
  auto report = gpuguard::analyze_placement({rank_on(0, 4, 0, 0, 2), rank_on(1, 4, 1, 1, 2), a, b});
  EXPECT_TRUE(has_cause(report, PlacementCause::kGlobalRankAsLocal));
  EXPECT_IN("on node-b, ranks 2 and 3 have a local rank equal to their global rank, but that host shows 2 GPUs", report.message);
  EXPECT_IN("never the global RANK", report.message);
}

TEST(Placement, ContainersWithDifferentHostnamesOnOneGpu) {
  auto report = gpuguard::analyze_placement({rank_on(0, 2, 0, 0, 1, "pod-a"), rank_on(1, 2, 0, 0, 1, "pod-b")});
  ASSERT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_TRUE(has_cause(report, PlacementCause::kContainersShareGpu));
  EXPECT_IN("report different hosts (pod-a, pod-b) but the same GPU", report.message);
}

TEST(Placement, MultiRankGpuModeDoesNotSilenceATrueDuplicate) {
  // NCCL_MULTI_RANK_GPU_ENABLE=1 turns NCCL's own check off; the ranks still sit on one device
  auto a = rank_on(0, 2, 0, 0, 1);
  auto b = rank_on(1, 2, 0, 0, 1);
  a.multi_rank_gpu_enabled = b.multi_rank_gpu_enabled = true;
  auto report = gpuguard::analyze_placement({a, b});
  EXPECT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_IN("2 ranks of group 'default' share 1 GPU. NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved: "
            "it turns off the check of NCCL 2.30 and later (\"Multiple Ranks are using the same GPU/Partition\"), "
            "so with those nothing else would stop them", report.message);
  // an older NCCL, like the lent GPU's 2.28.9, has no such switch: the message says what that one does
  EXPECT_IN("(NCCL 2.29 and earlier, which have no such switch, stop them with \"Duplicate GPU detected\")",
            report.message);
  EXPECT_IN("gpuguard stops every rank all the same", report.message);
  b.multi_rank_gpu_enabled = false;
  report = gpuguard::analyze_placement({a, b});
  EXPECT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_IN("NCCL_MULTI_RANK_GPU_ENABLE=1 would silence that, not fix it", report.message);
}

IdentityRecord rank_on_mig(int rank, int world, int instance, const std::string& host = "node-a") {
  const char* kMig[] = {"MIG-1f2e3d4c-0001-5001-9001-aa0000000001", "MIG-1f2e3d4c-0002-5002-9002-aa0000000002",
                        "MIG-1f2e3d4c-0003-5003-9003-aa0000000003"};
  IdentityRecord r = rank_on(rank, world, 0, 0, 1, host);  // every instance: cuda:0 of its process, GPU 0's PCI id
  r.gpu_uuid = kMig[instance];
  r.cuda_visible_devices = std::string(kMig[instance]);
  return r;
}

TEST(Placement, DifferentMigInstancesOfOneGpuAreAWarningNamingNcclVersions) {
  auto report = gpuguard::analyze_placement({rank_on_mig(0, 3, 0), rank_on_mig(1, 3, 1), rank_on_mig(2, 3, 2)});
  ASSERT_EQ(report.severity, PlacementReport::Severity::kWarning);
  EXPECT_TRUE(has_cause(report, PlacementCause::kMigInstancesOfOneGpu));
  ASSERT_EQ(report.shared.size(), 1u);
  EXPECT_TRUE(report.shared[0].warning_only);
  EXPECT_EQ(report.shared[0].gpu_uuid, "");
  EXPECT_EQ(report.shared[0].pci_bus_id, "0000:18:00.0");
  EXPECT_IN("3 ranks of group 'default' are on different MIG instances of 1 GPU: each has a device of its own, "
            "so gpuguard lets the job continue. NCCL will not: it sees one GPU (2.30 and later compare the GPU's "
            "UUID, which every instance reports to it, and stop with \"Multiple Ranks are using the same "
            "GPU/Partition\" unless NCCL_MULTI_RANK_GPU_ENABLE=1; 2.29 and earlier compare the PCI bus id and stop "
            "with \"Duplicate GPU detected\")", report.message);
  EXPECT_IN("GPU at PCI 0000:18:00.0 on node-a is split into MIG instances used by ranks 0, 1 and 2:", report.message);
  EXPECT_IN("rank 1: host node-a, cuda:0, local rank 1, pid 1001, "
            "CUDA_VISIBLE_DEVICES=MIG-1f2e3d4c-0002-5002-9002-aa0000000002, launcher torchrun", report.message);
  auto unset = rank_on_mig(1, 3, 1);
  unset.cuda_visible_devices.reset();  // the instance the driver showed first: named on its line
  EXPECT_IN("CUDA_VISIBLE_DEVICES unset, MIG-1f2e3d4c-0002-5002-9002-aa0000000002, launcher torchrun",
            gpuguard::analyze_placement({rank_on_mig(0, 3, 0), unset}).message);
  EXPECT_IN("Fix: with NCCL 2.30 or later set NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank (safe here: the instances "
            "are separate, and gpuguard still stops ranks that share one instance)", report.message);
  EXPECT_IN("with NCCL 2.29 or earlier, which has no such switch, upgrade NCCL, or give each rank a MIG instance on "
            "a different GPU", report.message);
  // with the switch set on every rank: still a warning, now saying NCCL 2.30+ accepts them
  std::vector<IdentityRecord> enabled = {rank_on_mig(0, 2, 0), rank_on_mig(1, 2, 1)};
  for (auto& r : enabled) r.multi_rank_gpu_enabled = true;
  report = gpuguard::analyze_placement(enabled);
  EXPECT_EQ(report.severity, PlacementReport::Severity::kWarning);
  EXPECT_IN("NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved, so NCCL 2.30 and later accept them; NCCL "
            "2.29 and earlier, which have no such switch, stop them", report.message);
}

TEST(Placement, MigInstancesOfTheSameGpuOnDifferentHostsAreNotRelated) {
  auto report = gpuguard::analyze_placement({rank_on_mig(0, 2, 0, "node-a"), rank_on_mig(1, 2, 1, "node-b")});
  EXPECT_EQ(report.severity, PlacementReport::Severity::kOk);
}

TEST(Placement, TwoRanksOnOneMigInstanceAreAnErrorEvenWithMultiRankGpuMode) {
  auto a = rank_on_mig(0, 3, 1);
  auto b = rank_on_mig(1, 3, 1);
  auto c = rank_on_mig(2, 3, 2);
  a.multi_rank_gpu_enabled = b.multi_rank_gpu_enabled = c.multi_rank_gpu_enabled = true;
  auto report = gpuguard::analyze_placement({a, b, c, b});  // b twice: the exchange may hand a record over twice
  ASSERT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_EQ(report.shared_devices_total, 1);
  EXPECT_EQ(report.ranks_sharing_total, 2);
  EXPECT_IN("2 ranks of group 'default' share 1 device (a GPU or one MIG instance). NCCL_MULTI_RANK_GPU_ENABLE=1 is "
            "set on every rank involved", report.message);
  EXPECT_IN("MIG instance MIG-1f2e3d4c-0002-5002-9002-aa0000000002 of the GPU at PCI 0000:18:00.0 is shared by "
            "ranks 0 and 1:", report.message);
  EXPECT_IN("every rank on it was given CUDA_VISIBLE_DEVICES=MIG-1f2e3d4c-0002-5002-9002-aa0000000002, so each "
            "got the same MIG instance", report.message);
  EXPECT_IN("Fix: give each rank its own MIG instance: a different CUDA_VISIBLE_DEVICES=MIG-<uuid> per process "
            "(nvidia-smi -L lists them)", report.message);
  EXPECT_EQ(report.message.find("$LOCAL_RANK"), std::string::npos);  // one MIG device per process: no index to pick
  // rank 2 on another instance of that GPU is listed too, as allowed
  EXPECT_IN("is split into MIG instances used by ranks 0, 1 and 2 [different instances: allowed]:", report.message);
  EXPECT_TRUE(has_cause(report, PlacementCause::kMigInstancesOfOneGpu));
  // one instance shared for no recognised reason: said so, although the split GPU's note has a cause
  a.cuda_visible_devices.reset();
  report = gpuguard::analyze_placement({a, b, c});
  EXPECT_IN("Likely cause: not recognised", report.message);
}

TEST(Placement, FailedAndGpulessRanksTakeNoPart) {
  auto failed = rank_on(1, 3, 0, 0, 1);
  failed.failure_kind = "RankMappingError";
  IdentityRecord cpu;
  cpu.rank = 2;
  cpu.world_size = 3;
  auto report = gpuguard::analyze_placement({rank_on(0, 3, 0, 0, 1), failed, cpu});
  EXPECT_EQ(report.severity, PlacementReport::Severity::kOk);
}

TEST(Placement, ReportOfAThousandRanksIsBounded) {
  // 128 hosts x 8 GPUs, every rank on cuda:0 of its host: 128 shared GPUs of 8 ranks each.
  std::vector<IdentityRecord> rs;
  for (int rank = 0; rank < 1024; ++rank) {
    std::string host = "node-" + std::to_string(rank / 8);
    auto r = rank_on(rank, 1024, 0, 0, 8, host);
    r.local_rank = rank % 8;
    r.local_world_size = 8;
    r.gpu_uuid = "GPU-" + std::to_string(10000000 + rank / 8) + "-0000-4000-8000-000000000000";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_EQ(report.shared_devices_total, 128);
  EXPECT_IN("1024 ranks of group 'default' share 128 GPUs.", report.message);
  EXPECT_IN("... and 112 more shared GPUs", report.message);
  EXPECT_IN("(the same on 127 other shared GPUs)", report.message);
  EXPECT_LT(report.message.size(), 20000u);
}

TEST(Placement, SampleWithTotalsSaysHowManyRanksInAll) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 16; ++i) rs.push_back(rank_on(i, 40, 0, 0, 1));
  gpuguard::PlacementContext ctx;
  ctx.device_rank_totals[kUuid[0]] = 40;
  ctx.host_rank_totals[rs[0].host_hash] = 40;
  ctx.shared_devices_total = 3;
  auto report = gpuguard::analyze_placement(rs, ctx);
  EXPECT_EQ(report.shared[0].total_ranks, 40);
  EXPECT_IN("(40 ranks in all)", report.message);
  EXPECT_IN("... and 24 more ranks", report.message);
  EXPECT_IN("... and 2 more shared GPUs", report.message);
  EXPECT_IN("40 processes on a host with 1 GPU", report.message);
}

namespace {

// Ray keeps resource amounts to 4 decimals: num_gpus=1/3 is reported back as 0.3333, 1/7 as 0.1429.
TEST(Placement, RayRoundedSharesStillReadAsFractions) {
  for (const auto& [share, label] : std::vector<std::pair<double, std::string>>{
           {0.3333, "1/3"}, {0.1429, "1/7"}, {0.5, "1/2"}, {0.0625, "1/16"}, {0.333, "0.333"}, {0.3, "0.3"}}) {
    std::vector<IdentityRecord> rs;
    for (int i = 0; i < 2; ++i) {
      auto r = rank_on(i, 2, 1, 0, 1);
      r.launcher = "ray";
      r.gpu_fraction = share;
      rs.push_back(r);
    }
    auto report = gpuguard::analyze_placement(rs);
    EXPECT_IN("Ray gave these actors " + label + " of a GPU each (num_gpus=" + label + ")", report.message);
  }
}

}  // namespace

// srun -n 2 torchrun --nproc_per_node 2 on one node (seen on a real SLURM cluster, tests/cluster): two agents
// each number their 2 workers 0 and 1, so ranks 0 and 2 meet on cuda:0 and ranks 1 and 3 on cuda:1.
TEST(Placement, TwoLauncherAgentsOnOneHostAreNamedNotAMissingSetDevice) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 4; ++i) {
    const int local = i % 2;
    auto r = rank_on(i, 4, local, local, 4);
    r.local_rank = local;
    r.local_world_size = 2;
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  ASSERT_EQ(report.severity, PlacementReport::Severity::kError);
  EXPECT_TRUE(has_cause(report, PlacementCause::kLaunchersShareHost));
  EXPECT_FALSE(has_cause(report, PlacementCause::kAllOnDeviceZero));
  EXPECT_IN("2 launcher agents on one host: node-a runs 4 ranks", report.message);
  EXPECT_IN("srun --ntasks-per-node=1 torchrun", report.message);
  EXPECT_EQ(report.message.find("never set"), std::string::npos) << report.message;
}

// One GPU shown, two ranks given the same CUDA_VISIBLE_DEVICES: the advice must not stop at
// "$LOCAL_RANK per process" (rank 1 would ask for a second GPU the host may not have).
TEST(Placement, OneVisibleGpuAdviceCoversAOneGpuHost) {
  std::vector<IdentityRecord> rs;
  for (int i = 0; i < 2; ++i) {
    auto r = rank_on(i, 2, 0, 0, 1);
    r.cuda_visible_devices = "0";
    rs.push_back(r);
  }
  auto report = gpuguard::analyze_placement(rs);
  EXPECT_IN("if the host has only one GPU, run one process of the group on it", report.message);
}
