// Unit tests of sched::Allocator: where Place puts a job, exactly, and what Commit refuses.
#include "sched/allocator.h"

#include <ostream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "sched/scheduler.h"

namespace gpufleet::sched {

// Readable failure messages: "node 1: gpu 5" instead of gtest's byte dumps. Static so each test
// program has its own and no two definitions meet at link time.
static void PrintTo(const TaskPlacement& task, std::ostream* out) {
  *out << "{node " << task.node << ": gpus";
  for (const GpuShare& share : task.gpus) {
    *out << ' ' << share.gpu;
    if (share.milli != kMilliPerGpu) *out << '@' << share.milli;
  }
  *out << '}';
}

namespace {

JobSpec GpuJob(JobId id, int32_t tasks, MilliGpu milli_per_task) {
  JobSpec spec;
  spec.id = id;
  spec.tasks = tasks;
  spec.gpu_milli_per_task = milli_per_task;
  return spec;
}

JobSpec WholeGpus(JobId id, int32_t gpus) {
  return GpuJob(id, 1, gpus * kMilliPerGpu);
}

TaskPlacement Task(int32_t node, std::vector<int32_t> gpus, MilliGpu milli = kMilliPerGpu) {
  TaskPlacement task{.node = node, .gpus = {}};
  for (int32_t gpu : gpus)
    task.gpus.push_back({.gpu = gpu, .milli = milli});
  return task;
}

Cluster Uniform(int32_t nodes, int32_t gpus_per_node, int32_t nodes_per_rack = 16,
                int32_t gpus_per_island = 8) {
  UniformClusterShape shape;
  shape.nodes = nodes;
  shape.gpus_per_node = gpus_per_node;
  shape.nodes_per_rack = nodes_per_rack;
  shape.gpus_per_nvlink_island = gpus_per_island;
  return MakeUniformCluster(shape);
}

// Occupies the listed GPUs of a node with a job of its own.
void Occupy(Allocator& allocator, JobId id, int32_t node, std::vector<int32_t> gpus) {
  JobSpec spec = WholeGpus(id, static_cast<int32_t>(gpus.size()));
  allocator.Commit(spec, {Task(node, std::move(gpus))});
}

TEST(AllocatorPlace, SingleGpuBinpackTakesTheFullestNode) {
  const Cluster cluster = Uniform(3, 8);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {0, 1});           // 6 free
  Occupy(allocator, 101, 1, {0, 1, 2, 3, 4});  // 3 free: the fullest node that has room
  const auto allocation = allocator.Place(WholeGpus(1, 1), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(1, {5})});
}

TEST(AllocatorPlace, SingleGpuSpreadTakesTheEmptiestNode) {
  const Cluster cluster = Uniform(3, 8);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {0, 1});
  Occupy(allocator, 101, 2, {0, 1, 2, 3, 4});
  const auto allocation = allocator.Place(WholeGpus(1, 1), PlacementPolicy::kSpread);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(1, {0})});
}

TEST(AllocatorPlace, BinpackFillsANodeBeforeOpeningTheNext) {
  const Cluster cluster = Uniform(2, 4);
  Allocator allocator(cluster);
  std::vector<int32_t> nodes;
  for (JobId id = 1; id <= 5; ++id) {
    const auto allocation = allocator.Place(WholeGpus(id, 1), PlacementPolicy::kBinPack);
    ASSERT_TRUE(allocation.has_value());
    nodes.push_back(allocation->at(0).node);
  }
  EXPECT_EQ(nodes[0], nodes[1]);
  EXPECT_EQ(nodes[0], nodes[2]);
  EXPECT_EQ(nodes[0], nodes[3]);
  EXPECT_NE(nodes[0], nodes[4]);
}

TEST(AllocatorPlace, SpreadAlternatesBetweenNodes) {
  const Cluster cluster = Uniform(2, 4);
  Allocator allocator(cluster);
  const auto first = allocator.Place(WholeGpus(1, 1), PlacementPolicy::kSpread);
  const auto second = allocator.Place(WholeGpus(2, 1), PlacementPolicy::kSpread);
  ASSERT_TRUE(first && second);
  EXPECT_NE(first->at(0).node, second->at(0).node);
}

TEST(AllocatorPlace, FourGpusOnAnEmptyTwoIslandNodeUseOneIsland) {
  const Cluster cluster = Uniform(1, 8, 16, 4);
  Allocator allocator(cluster);
  const auto allocation = allocator.Place(WholeGpus(1, 4), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {0, 1, 2, 3})});
}

TEST(AllocatorPlace, FourGpusAvoidABrokenIsland) {
  const Cluster cluster = Uniform(1, 8, 16, 4);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {1});  // island 0 keeps 3 free GPUs: not enough for the task
  const auto allocation = allocator.Place(WholeGpus(1, 4), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {4, 5, 6, 7})});
}

TEST(AllocatorPlace, SingleGpuBinpackTakesTheFullestIsland) {
  const Cluster cluster = Uniform(1, 8, 16, 4);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {5});  // island 1 has 3 free: a lone GPU goes there
  const auto allocation = allocator.Place(WholeGpus(1, 1), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {4})});
}

TEST(AllocatorPlace, TaskSpansIslandsOnlyWhenNoIslandHoldsIt) {
  const Cluster cluster = Uniform(1, 8, 16, 4);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {1});
  Occupy(allocator, 101, 0, {5});
  const auto allocation = allocator.Place(WholeGpus(1, 4), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {0, 2, 3, 4})});
}

TEST(AllocatorPlace, TwoTaskGangOnOneNodeTakesOneIslandPerTask) {
  const Cluster cluster = Uniform(2, 8, 16, 4);
  Allocator allocator(cluster);
  const auto allocation = allocator.Place(GpuJob(1, 2, 4000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, (Allocation{Task(0, {0, 1, 2, 3}), Task(0, {4, 5, 6, 7})}));
}

JobSpec OnNodes(JobSpec spec, int32_t tasks_per_node) {
  spec.tasks_per_node = tasks_per_node;
  return spec;
}

// tasks_per_node: a group on each of tasks / tasks_per_node distinct nodes, however much room
// one node has; a node's tasks are consecutive, in the order of the nodes.
TEST(AllocatorPlace, TasksPerNodeSpreadsTheGangOverDistinctNodes) {
  const Cluster cluster = Uniform(3, 8);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 1, {0, 1, 2, 3, 4, 5});  // node 1 holds 2 GPUs, too few for a group
  auto allocation = allocator.Place(OnNodes(GpuJob(1, 2, 1000), 1), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  ASSERT_EQ(allocation->size(), 2u);
  EXPECT_NE((*allocation)[0].node, (*allocation)[1].node);
  allocation = allocator.Place(OnNodes(GpuJob(2, 4, 2000), 2), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  // Nodes 0 and 2 each have 7 free: 2 tasks of 2 GPUs on each; node 1's 2 free GPUs hold only
  // one task of 2, not a group.
  std::vector<int32_t> nodes;
  for (const TaskPlacement& task : *allocation)
    nodes.push_back(task.node);
  EXPECT_EQ(nodes[0], nodes[1]);
  EXPECT_EQ(nodes[2], nodes[3]);
  EXPECT_NE(nodes[0], nodes[2]);
  EXPECT_NE(nodes[0], 1);
  EXPECT_NE(nodes[2], 1);
  // Without tasks_per_node the same gang packs onto one node.
  Allocator packed(cluster);
  allocation = packed.Place(GpuJob(3, 2, 1000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ((*allocation)[0].node, (*allocation)[1].node);
}

TEST(AllocatorPlace, TasksPerNodeForSharesAndCpuOnlyTasks) {
  const Cluster cluster = Uniform(2, 2);
  Allocator allocator(cluster);
  auto allocation = allocator.Place(OnNodes(GpuJob(1, 2, 500), 1), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, (Allocation{Task(0, {0}, 500), Task(1, {0}, 500)}));
  // Best fit fills the shared GPU of each node before opening another.
  allocation = allocator.Place(OnNodes(GpuJob(2, 4, 250), 2), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, (Allocation{Task(0, {0}, 250), Task(0, {0}, 250), Task(1, {0}, 250),
                                     Task(1, {0}, 250)}));
  JobSpec cpu = OnNodes(GpuJob(3, 2, 0), 1);
  cpu.cpu_milli_per_task = 1000;
  allocation = allocator.Place(cpu, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_NE((*allocation)[0].node, (*allocation)[1].node);
  // Three groups on two nodes: never, and nothing is taken.
  const int64_t free = allocator.FreeGpuMilli();
  EXPECT_FALSE(allocator.Place(OnNodes(GpuJob(4, 3, 250), 1), PlacementPolicy::kBinPack));
  EXPECT_EQ(allocator.FreeGpuMilli(), free);
}

TEST(AllocatorPlace, GangOfTwoFullNodesStaysInOneRack) {
  // Racks {0,1} and {2,3}. One busy GPU on node 1 leaves rack 0 unable to hold 2x8; placing
  // anywhere would take nodes 0 and 2 across racks.
  const Cluster cluster = Uniform(4, 8, 2);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 1, {0});
  const auto allocation = allocator.Place(GpuJob(1, 2, 8000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation,
            (Allocation{Task(2, {0, 1, 2, 3, 4, 5, 6, 7}), Task(3, {0, 1, 2, 3, 4, 5, 6, 7})}));
}

TEST(AllocatorPlace, GangOnEmptyClusterTakesTheFirstRack) {
  const Cluster cluster = Uniform(4, 8, 2);
  Allocator allocator(cluster);
  const auto allocation = allocator.Place(GpuJob(1, 2, 8000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  ASSERT_EQ(allocation->size(), 2u);
  EXPECT_EQ(allocation->at(0).node, 0);
  EXPECT_EQ(allocation->at(1).node, 1);
}

TEST(AllocatorPlace, GangRackChoiceBinpackTightestSpreadEmptiest) {
  // Two racks of three nodes; node 0 is full, so rack 0 has 16 free GPUs and rack 1 has 24.
  const Cluster cluster = Uniform(6, 8, 3);
  for (const PlacementPolicy policy : {PlacementPolicy::kBinPack, PlacementPolicy::kSpread}) {
    Allocator allocator(cluster);
    Occupy(allocator, 100, 0, {0, 1, 2, 3, 4, 5, 6, 7});
    const auto allocation = allocator.Place(GpuJob(1, 2, 8000), policy);
    ASSERT_TRUE(allocation.has_value());
    ASSERT_EQ(allocation->size(), 2u);
    const std::pair<int32_t, int32_t> nodes{allocation->at(0).node, allocation->at(1).node};
    if (policy == PlacementPolicy::kBinPack) {
      EXPECT_EQ(nodes, std::pair(1, 2));
    } else {
      EXPECT_EQ(nodes, std::pair(3, 4));
    }
  }
}

TEST(AllocatorPlace, GangSpansRacksWhenNoRackHoldsIt) {
  const Cluster cluster = Uniform(4, 8, 2);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 1, {0});
  Occupy(allocator, 101, 2, {0});
  const auto allocation = allocator.Place(GpuJob(1, 2, 8000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  ASSERT_EQ(allocation->size(), 2u);
  EXPECT_EQ(allocation->at(0).node, 0);
  EXPECT_EQ(allocation->at(1).node, 3);
}

TEST(AllocatorPlace, GangIsAllOrNothing) {
  const Cluster cluster = Uniform(4, 8);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {0, 1, 2, 3, 4, 5, 6, 7});
  Occupy(allocator, 101, 1, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_FALSE(allocator.Place(GpuJob(1, 3, 8000), PlacementPolicy::kBinPack).has_value());
  EXPECT_EQ(allocator.FreeGpuMilli(), 16'000);  // nothing held back by the failed gang
  const auto fits = allocator.Place(GpuJob(2, 2, 8000), PlacementPolicy::kBinPack);
  ASSERT_TRUE(fits.has_value());
  EXPECT_EQ(fits->at(0).node, 2);
  EXPECT_EQ(fits->at(1).node, 3);
}

TEST(AllocatorPlace, FractionalJobsShareOneGpuUnderBinpack) {
  const Cluster cluster = Uniform(1, 4);
  Allocator allocator(cluster);
  for (JobId id = 1; id <= 3; ++id) {
    const auto allocation = allocator.Place(GpuJob(id, 1, 300), PlacementPolicy::kBinPack);
    ASSERT_TRUE(allocation.has_value());
    EXPECT_EQ(*allocation, Allocation{Task(0, {0}, 300)}) << "job " << id;
  }
  EXPECT_EQ(allocator.FreeGpuMilli(), 4000 - 900);
  // The shared GPU has 100 left: a fourth 0.3 share opens the next GPU.
  const auto fourth = allocator.Place(GpuJob(4, 1, 300), PlacementPolicy::kBinPack);
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(*fourth, Allocation{Task(0, {1}, 300)});
}

TEST(AllocatorPlace, FractionalJobsTakeSeparateGpusUnderSpread) {
  const Cluster cluster = Uniform(1, 4);
  Allocator allocator(cluster);
  for (JobId id = 1; id <= 3; ++id) {
    const auto allocation = allocator.Place(GpuJob(id, 1, 300), PlacementPolicy::kSpread);
    ASSERT_TRUE(allocation.has_value());
    EXPECT_EQ(*allocation, Allocation{Task(0, {static_cast<int32_t>(id) - 1}, 300)})
        << "job " << id;
  }
}

TEST(AllocatorPlace, FractionalSpreadSharesTheRoomiestGpuOnceNoneIsWhole) {
  const Cluster cluster = Uniform(1, 2);
  Allocator allocator(cluster);
  allocator.Commit(GpuJob(100, 1, 600), {Task(0, {0}, 600)});  // GPU 0 has 400 left
  allocator.Commit(GpuJob(101, 1, 300), {Task(0, {1}, 300)});  // GPU 1 has 700 left
  const auto allocation = allocator.Place(GpuJob(1, 1, 300), PlacementPolicy::kSpread);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {1}, 300)});
  const auto binpacked = allocator.Place(GpuJob(2, 1, 300), PlacementPolicy::kBinPack);
  ASSERT_TRUE(binpacked.has_value());
  EXPECT_EQ(*binpacked, Allocation{Task(0, {0}, 300)});
}

TEST(AllocatorPlace, FractionalBinpackOpensAGpuOnTheFullestNode) {
  const Cluster cluster = Uniform(2, 4);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 1, {0, 1});
  const auto allocation = allocator.Place(GpuJob(1, 1, 500), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(1, {2}, 500)});
}

TEST(AllocatorPlace, FractionalGangRollsBackWhenItDoesNotFit) {
  const Cluster cluster = Uniform(1, 2);
  Allocator allocator(cluster);
  // Four tasks of 0.6 GPU need four GPUs with 0.6 free; there are two.
  EXPECT_FALSE(allocator.Place(GpuJob(1, 4, 600), PlacementPolicy::kBinPack).has_value());
  EXPECT_EQ(allocator.FreeGpuMilli(), 2000);
  const auto whole = allocator.Place(WholeGpus(2, 2), PlacementPolicy::kBinPack);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(*whole, Allocation{Task(0, {0, 1})});
}

Cluster TwoModelCluster() {
  // node-a: GPUs 0-1 are 16 GiB V100s, 2-3 are 80 GiB H100s; node-b: four 32 GiB V100s.
  Cluster cluster;
  Node a{.name = "node-a",
         .rack = "r",
         .spine = "s",
         .cpu_milli = 64'000,
         .memory_mib = 1 << 20,
         .gpus = {},
         .schedulable = true};
  for (int32_t g = 0; g < 4; ++g) {
    const bool h100 = g >= 2;
    a.gpus.push_back(Gpu{.uuid = "a" + std::to_string(g),
                         .model = h100 ? "H100-80GB" : "V100",
                         .memory_mib = h100 ? 81'559 : 16'384,
                         .index = g,
                         .nvlink_island = 0,
                         .healthy = true});
  }
  Node b = a;
  b.name = "node-b";
  for (Gpu& gpu : b.gpus) {
    gpu.model = "V100";
    gpu.memory_mib = 32'768;
  }
  cluster.nodes = {a, b};
  return cluster;
}

TEST(AllocatorPlace, GpuModelConstraintPicksMatchingGpusOnly) {
  const Cluster cluster = TwoModelCluster();
  Allocator allocator(cluster);
  JobSpec spec = WholeGpus(1, 2);
  spec.gpu_models = {"A100", "H100-80GB"};
  const auto allocation = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {2, 3})});
  // No H100 is left; the next one waits even though six V100s are free.
  spec.id = 2;
  EXPECT_FALSE(allocator.Place(spec, PlacementPolicy::kBinPack).has_value());
  EXPECT_EQ(allocator.WhyNotNow(spec), WaitReason::kInsufficientGpus);
}

TEST(AllocatorPlace, FractionalGpuModelConstraint) {
  const Cluster cluster = TwoModelCluster();
  Allocator allocator(cluster);
  JobSpec spec = GpuJob(1, 1, 500);
  spec.gpu_models = {"H100-80GB"};
  const auto allocation = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(0, {2}, 500)});
}

TEST(AllocatorPlace, MinimumGpuMemorySkipsSmallGpus) {
  const Cluster cluster = TwoModelCluster();
  Allocator allocator(cluster);
  JobSpec spec = WholeGpus(1, 4);
  spec.min_gpu_memory_mib = 20'000;  // node-a has only two such GPUs, node-b four
  const auto allocation = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(1, {0, 1, 2, 3})});
  spec = WholeGpus(2, 1);
  spec.min_gpu_memory_mib = 40'000;
  const auto big = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(*big, Allocation{Task(0, {2})});
}

TEST(AllocatorPlace, NeverUsesAnUnschedulableNode) {
  Cluster cluster = Uniform(2, 4);
  cluster.nodes[0].schedulable = false;
  for (const PlacementPolicy policy : {PlacementPolicy::kBinPack, PlacementPolicy::kSpread}) {
    Allocator allocator(cluster);
    EXPECT_EQ(allocator.UsableGpuMilli(), 4000);
    for (JobId id = 1; id <= 4; ++id) {
      const auto allocation = allocator.Place(WholeGpus(id, 1), policy);
      ASSERT_TRUE(allocation.has_value());
      EXPECT_EQ(allocation->at(0).node, 1);
    }
    EXPECT_FALSE(allocator.Place(WholeGpus(5, 1), policy).has_value());
    EXPECT_FALSE(allocator.Place(GpuJob(6, 1, 250), policy).has_value());
    JobSpec cpu_only = GpuJob(7, 1, 0);
    cpu_only.cpu_milli_per_task = 1000;
    const auto cpu = allocator.Place(cpu_only, policy);
    ASSERT_TRUE(cpu.has_value());
    EXPECT_EQ(cpu->at(0).node, 1);
  }
}

TEST(AllocatorPlace, NeverUsesAnUnhealthyGpu) {
  Cluster cluster = Uniform(1, 4);
  cluster.nodes[0].gpus[0].healthy = false;
  cluster.nodes[0].gpus[2].healthy = false;
  Allocator allocator(cluster);
  const auto pair = allocator.Place(WholeGpus(1, 2), PlacementPolicy::kBinPack);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(*pair, Allocation{Task(0, {1, 3})});
  EXPECT_FALSE(allocator.Place(GpuJob(2, 1, 100), PlacementPolicy::kBinPack).has_value());
  EXPECT_FALSE(allocator.Place(GpuJob(3, 1, 100), PlacementPolicy::kSpread).has_value());
}

TEST(AllocatorPlace, RespectsNodeCpuAndMemory) {
  Cluster cluster = Uniform(2, 4);
  cluster.nodes[0].cpu_milli = 8'000;
  Allocator allocator(cluster);
  JobSpec spec = WholeGpus(1, 1);
  spec.cpu_milli_per_task = 6'000;
  spec.memory_mib_per_task = 1024;
  const auto first = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(first.has_value());
  spec.id = 2;
  const auto second = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(first->at(0).node, second->at(0).node);  // 12,000 milli-CPU exceed node 0's 8,000
  spec.id = 3;
  spec.memory_mib_per_task = cluster.nodes[1].memory_mib;  // more than node 1 has left
  EXPECT_FALSE(allocator.Place(spec, PlacementPolicy::kBinPack).has_value());
  EXPECT_EQ(allocator.WhyNotNow(spec), WaitReason::kInsufficientCpuOrMemory);
}

TEST(AllocatorPlace, CpuOnlyBinpackAvoidsNodesWithFreeGpus) {
  const Cluster cluster = Uniform(2, 2);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 1, {0, 1});
  JobSpec spec = GpuJob(1, 2, 0);
  spec.cpu_milli_per_task = 1000;
  const auto allocation = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, (Allocation{Task(1, {}), Task(1, {})}));
  EXPECT_EQ(allocator.FreeGpuMilli(), 2000);
}

TEST(AllocatorCommit, DoubleAllocationThrowsAndChangesNothing) {
  const Cluster cluster = Uniform(1, 4);
  Allocator allocator(cluster);
  Occupy(allocator, 100, 0, {0});
  // Job 1 asks for GPUs 1 and 0; GPU 0 is taken, so GPU 1 must stay free too.
  const JobSpec clash = GpuJob(1, 2, 1000);
  EXPECT_THROW(allocator.Commit(clash, {Task(0, {1}), Task(0, {0})}), std::invalid_argument);
  EXPECT_EQ(allocator.FreeGpuMilli(), 3000);
  EXPECT_NO_THROW(allocator.Commit(WholeGpus(2, 3), {Task(0, {1, 2, 3})}));
  EXPECT_EQ(allocator.FreeGpuMilli(), 0);
}

TEST(AllocatorCommit, SharesOverOneGpuThrow) {
  const Cluster cluster = Uniform(1, 1);
  Allocator allocator(cluster);
  allocator.Commit(GpuJob(1, 1, 600), {Task(0, {0}, 600)});
  EXPECT_THROW(allocator.Commit(GpuJob(2, 1, 500), {Task(0, {0}, 500)}), std::invalid_argument);
  EXPECT_NO_THROW(allocator.Commit(GpuJob(3, 1, 400), {Task(0, {0}, 400)}));
  EXPECT_EQ(allocator.FreeGpuMilli(), 0);
}

TEST(AllocatorCommit, RejectsMalformedAllocations) {
  const Cluster cluster = Uniform(1, 2);
  Allocator allocator(cluster);
  EXPECT_THROW(allocator.Commit(GpuJob(1, 2, 1000), {Task(0, {0})}), std::invalid_argument);
  EXPECT_THROW(allocator.Commit(WholeGpus(1, 1), {Task(1, {0})}), std::invalid_argument);
  EXPECT_THROW(allocator.Commit(WholeGpus(1, 1), {Task(0, {2})}), std::invalid_argument);
  EXPECT_THROW(allocator.Commit(WholeGpus(1, 1), {Task(0, {0}, 0)}), std::invalid_argument);
  EXPECT_THROW(allocator.Commit(WholeGpus(1, 1), {Task(0, {0}, 1001)}), std::invalid_argument);
  EXPECT_EQ(allocator.FreeGpuMilli(), 2000);
}

TEST(AllocatorCommit, CpuOverAllocationThrowsAndChangesNothing) {
  Cluster cluster = Uniform(1, 2);
  cluster.nodes[0].cpu_milli = 4000;
  Allocator allocator(cluster);
  JobSpec spec = GpuJob(1, 2, 1000);
  spec.cpu_milli_per_task = 3000;
  EXPECT_THROW(allocator.Commit(spec, {Task(0, {0}), Task(0, {1})}), std::invalid_argument);
  EXPECT_EQ(allocator.FreeGpuMilli(), 2000);
  spec.tasks = 1;
  spec.gpu_milli_per_task = 2000;
  EXPECT_NO_THROW(allocator.Commit(spec, {Task(0, {0, 1})}));
}

TEST(AllocatorCommit, AcceptsJobsOnDrainedNodesAndFaultyGpusWithoutOfferingThem) {
  Cluster cluster = Uniform(2, 2);
  cluster.nodes[0].schedulable = false;
  cluster.nodes[1].gpus[1].healthy = false;
  Allocator allocator(cluster);
  EXPECT_EQ(allocator.UsableGpuMilli(), 1000);
  EXPECT_NO_THROW(allocator.Commit(WholeGpus(1, 2), {Task(0, {0, 1})}));
  EXPECT_NO_THROW(allocator.Commit(WholeGpus(2, 1), {Task(1, {1})}));
  EXPECT_EQ(allocator.FreeGpuMilli(), 1000);
  EXPECT_THROW(allocator.Commit(WholeGpus(3, 1), {Task(1, {1})}), std::invalid_argument);
  allocator.Release(WholeGpus(1, 2), {Task(0, {0, 1})});
  EXPECT_EQ(allocator.FreeGpuMilli(), 1000);
  const auto allocation = allocator.Place(WholeGpus(4, 1), PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(*allocation, Allocation{Task(1, {0})});
}

TEST(AllocatorRelease, ReturnsGpusCpuAndMemory) {
  Cluster cluster = Uniform(1, 2);
  cluster.nodes[0].cpu_milli = 2000;
  Allocator allocator(cluster);
  JobSpec spec = WholeGpus(1, 2);
  spec.cpu_milli_per_task = 2000;
  const auto allocation = allocator.Place(spec, PlacementPolicy::kBinPack);
  ASSERT_TRUE(allocation.has_value());
  EXPECT_EQ(allocator.FreeGpuMilli(), 0);
  allocator.Release(spec, *allocation);
  EXPECT_EQ(allocator.FreeGpuMilli(), 2000);
  spec.id = 2;
  EXPECT_TRUE(allocator.Place(spec, PlacementPolicy::kBinPack).has_value());
}

TEST(CheckFeasible, TellsWhyAJobCanNeverRun) {
  const Cluster cluster = Uniform(2, 8);
  EXPECT_FALSE(CheckFeasible(cluster, GpuJob(1, 2, 8000)).has_value());
  EXPECT_FALSE(CheckFeasible(cluster, GpuJob(1, 1, 500)).has_value());
  EXPECT_EQ(CheckFeasible(cluster, GpuJob(1, 3, 8000)), WaitReason::kInfeasibleGpuCount);
  EXPECT_EQ(CheckFeasible(cluster, WholeGpus(1, 16)), WaitReason::kInfeasibleTaskShape);
  JobSpec model = WholeGpus(1, 1);
  model.gpu_models = {"A100"};
  EXPECT_EQ(CheckFeasible(cluster, model), WaitReason::kInfeasibleGpuModel);
  JobSpec memory = WholeGpus(1, 1);
  memory.min_gpu_memory_mib = 100'000;
  EXPECT_EQ(CheckFeasible(cluster, memory), WaitReason::kInfeasibleGpuModel);
  JobSpec cpu = WholeGpus(1, 1);
  cpu.cpu_milli_per_task = cluster.nodes[0].cpu_milli + 1;
  EXPECT_EQ(CheckFeasible(cluster, cpu), WaitReason::kInfeasibleTaskShape);
  // Two tasks fit the two nodes, but three distinct nodes they have not.
  EXPECT_FALSE(CheckFeasible(cluster, OnNodes(GpuJob(1, 2, 1000), 1)).has_value());
  EXPECT_EQ(CheckFeasible(cluster, OnNodes(GpuJob(1, 3, 1000), 1)),
            WaitReason::kInfeasibleNodeCount);
  EXPECT_EQ(CheckFeasible(cluster, OnNodes(GpuJob(1, 4, 1000), 2)), std::nullopt);
  EXPECT_EQ(CheckFeasible(cluster, OnNodes(GpuJob(1, 4, 8000), 2)),
            WaitReason::kInfeasibleGpuCount);
  EXPECT_EQ(DescribeWait(WaitReason::kInfeasibleNodeCount, OnNodes(GpuJob(1, 3, 1000), 1)),
            "can never run: it needs 3 distinct nodes that each hold 1 of its tasks, and fewer "
            "nodes can");
}

TEST(FeasibilityChecker, AnswersAsCheckFeasibleForEveryShapeAndRemembersThem) {
  const Cluster cluster = Uniform(2, 8);
  FeasibilityChecker checker(cluster);
  std::vector<JobSpec> specs = {GpuJob(1, 2, 8000),
                                GpuJob(2, 1, 500),
                                GpuJob(3, 3, 8000),
                                WholeGpus(4, 16),
                                OnNodes(GpuJob(5, 3, 1000), 1),
                                OnNodes(GpuJob(6, 4, 1000), 2)};
  JobSpec model = WholeGpus(7, 1);
  model.gpu_models = {"A100"};
  specs.push_back(model);
  model.gpu_models = {"H100-80GB"};
  specs.push_back(model);
  // Twice over, with other ids (the second round is answered from what the first learnt), and
  // tasks_per_node apart so that shapes differing only there are told apart.
  for (int round = 0; round < 2; ++round) {
    for (JobSpec spec : specs) {
      spec.id += 100 * round;
      EXPECT_EQ(checker.Check(spec), CheckFeasible(cluster, spec)) << "job " << spec.id;
    }
  }
  EXPECT_EQ(checker.Check(OnNodes(GpuJob(9, 3, 1000), 1)), WaitReason::kInfeasibleNodeCount);
  EXPECT_EQ(checker.Check(GpuJob(10, 3, 1000)), std::nullopt);
}

TEST(CheckFeasible, IgnoresUnusableCapacity) {
  Cluster cluster = Uniform(2, 8);
  cluster.nodes[1].schedulable = false;
  EXPECT_EQ(CheckFeasible(cluster, GpuJob(1, 2, 8000)), WaitReason::kInfeasibleGpuCount);
  cluster.nodes[0].gpus[3].healthy = false;
  EXPECT_EQ(CheckFeasible(cluster, WholeGpus(1, 8)), WaitReason::kInfeasibleGpuCount);
  EXPECT_FALSE(CheckFeasible(cluster, WholeGpus(1, 7)).has_value());
  cluster.nodes[0].schedulable = false;
  EXPECT_EQ(CheckFeasible(cluster, WholeGpus(1, 1)), WaitReason::kInfeasibleGpuCount);
}

TEST(WaitReasons, CodesAreStableAndInfeasibleOnesAreMarked) {
  EXPECT_STREQ(WaitReasonCode(WaitReason::kInsufficientGpus), "insufficient_gpus");
  EXPECT_STREQ(WaitReasonCode(WaitReason::kInfeasibleGpuModel), "infeasible_gpu_model");
  EXPECT_TRUE(IsInfeasible(WaitReason::kInfeasibleGpuCount));
  EXPECT_TRUE(IsInfeasible(WaitReason::kInfeasibleTaskShape));
  EXPECT_FALSE(IsInfeasible(WaitReason::kBlockedByQueueHead));
  EXPECT_FALSE(IsInfeasible(WaitReason::kReservedForEarlierJob));
  JobSpec spec = GpuJob(1, 2, 500);
  spec.gpu_models = {"H100-80GB"};
  EXPECT_EQ(DescribeWait(WaitReason::kInsufficientGpus, spec),
            "waiting for GPUs: 2 tasks of 0.5 of a GPU (H100-80GB) are not free right now");
}

// ---- FGD (PlacementPolicy::kFgd): hand-made cases where best fit fragments and FGD does not ----

TaskClass Class(MilliGpu milli, int64_t weight = 1, MilliCpu cpu = 0) {
  TaskClass task_class;
  task_class.gpu_milli_per_task = milli;
  task_class.cpu_milli_per_task = cpu;
  task_class.weight = weight;
  return task_class;
}

TEST(AllocatorFgd, SharedTaskKeepsRoomForTheWorkloadsShares) {
  // Two 1-GPU nodes, 600 and 1,000 milli-GPUs free; the workload is 0.6-GPU tasks. Best fit puts a
  // 0.1-GPU task on the tighter GPU, leaving 500 that no 0.6 task can use; FGD opens the other
  // GPU, so that both GPUs still hold a 0.6 task.
  const Cluster cluster = Uniform(2, 1);
  for (PlacementPolicy policy : {PlacementPolicy::kBinPack, PlacementPolicy::kFgd}) {
    Allocator allocator(cluster);
    allocator.SetTargetWorkload({Class(600)});
    allocator.Commit(GpuJob(100, 1, 400), {Task(0, {0}, 400)});
    const auto small = allocator.Place(GpuJob(1, 1, 100), policy);
    ASSERT_TRUE(small.has_value());
    const bool fgd = policy == PlacementPolicy::kFgd;
    EXPECT_EQ(*small, Allocation{Task(fgd ? 1 : 0, {0}, 100)}) << Name(policy);
    // FGD: 600 + 900 free, 0 fragmented; best fit: the 500 left on node 0 is a fragment.
    EXPECT_DOUBLE_EQ(allocator.Fragmentation(), fgd ? 0 : 500) << Name(policy);
    EXPECT_TRUE(allocator.Place(GpuJob(2, 1, 600), policy).has_value()) << Name(policy);
    EXPECT_EQ(allocator.Place(GpuJob(3, 1, 600), policy).has_value(), fgd) << Name(policy);
  }
}

TEST(AllocatorFgd, WholeGpuTaskKeepsNodesThatHoldTheWorkloadsGangs) {
  // Nodes with 2 and 3 free GPUs; the workload is 2-GPU tasks. Best fit takes a GPU of the
  // 2-GPU node, which then holds no 2-GPU task; FGD takes one of the 3, and both still hold one.
  const Cluster cluster = Uniform(2, 4);
  for (PlacementPolicy policy : {PlacementPolicy::kBinPack, PlacementPolicy::kFgd}) {
    Allocator allocator(cluster);
    allocator.SetTargetWorkload({Class(2000)});
    Occupy(allocator, 100, 0, {0, 1});
    Occupy(allocator, 101, 1, {0});
    const auto one = allocator.Place(WholeGpus(1, 1), policy);
    ASSERT_TRUE(one.has_value());
    const bool fgd = policy == PlacementPolicy::kFgd;
    EXPECT_EQ(one->at(0).node, fgd ? 1 : 0) << Name(policy);
    EXPECT_TRUE(allocator.Place(WholeGpus(2, 2), policy).has_value()) << Name(policy);
    EXPECT_EQ(allocator.Place(WholeGpus(3, 2), policy).has_value(), fgd) << Name(policy);
  }
}

TEST(AllocatorFgd, CpuOnlyTaskLeavesCpuForGpuTasks) {
  // Two 1-GPU nodes with 16 and 12 CPUs; the workload's GPU tasks need 8 CPUs. Best fit packs a
  // 6-CPU task on the node with less CPU free, stranding its GPU; FGD keeps both GPUs usable.
  Cluster cluster = Uniform(2, 1);
  cluster.nodes[0].cpu_milli = 16'000;
  cluster.nodes[1].cpu_milli = 12'000;
  JobSpec cpu_only = GpuJob(1, 1, 0);
  cpu_only.cpu_milli_per_task = 6'000;
  for (PlacementPolicy policy : {PlacementPolicy::kBinPack, PlacementPolicy::kFgd}) {
    Allocator allocator(cluster);
    allocator.SetTargetWorkload({Class(1000, 1, 8'000)});
    const auto placed = allocator.Place(cpu_only, policy);
    ASSERT_TRUE(placed.has_value());
    const bool fgd = policy == PlacementPolicy::kFgd;
    EXPECT_EQ(placed->at(0).node, fgd ? 0 : 1) << Name(policy);
    EXPECT_DOUBLE_EQ(allocator.Fragmentation(), fgd ? 0 : 1000) << Name(policy);
  }
}

TEST(AllocatorFgd, FragmentationIsTheExpectationOverTheWorkload) {
  // One node, GPUs free 600 and 1,000. Half the tasks ask 0.6 GPU: both GPUs serve them, nothing is
  // a fragment. A quarter ask 2 GPUs: they cannot run here, all 1,600 free is a fragment to them.
  // A quarter ask 0.8 GPU: the 600 is a fragment. Expected: (0 + 1600 + 600) / 4 = 550.
  const Cluster cluster = Uniform(1, 2);
  Allocator allocator(cluster);
  EXPECT_EQ(allocator.Fragmentation(), 0);  // no target workload
  allocator.Commit(GpuJob(100, 1, 400), {Task(0, {0}, 400)});
  allocator.SetTargetWorkload({Class(600, 2), Class(2000, 1), Class(800, 1)});
  EXPECT_DOUBLE_EQ(allocator.Fragmentation(), 550);
  // CPU-only tasks cannot use any GPU: every free GPU counts for them.
  allocator.SetTargetWorkload({Class(600, 1), Class(0, 1)});
  EXPECT_DOUBLE_EQ(allocator.Fragmentation(), 800);
}

TEST(AllocatorFgd, WithoutATargetWorkloadPlacesAsBestFit) {
  const Cluster cluster = Uniform(3, 4);
  Allocator fgd(cluster);
  Allocator binpack(cluster);
  const std::vector<JobSpec> jobs = {GpuJob(1, 1, 300), WholeGpus(2, 2), GpuJob(3, 2, 700),
                                     WholeGpus(4, 3), GpuJob(5, 1, 0)};
  for (const JobSpec& job : jobs)
    EXPECT_EQ(fgd.Place(job, PlacementPolicy::kFgd), binpack.Place(job, PlacementPolicy::kBinPack))
        << "job " << job.id;
}

TEST(AllocatorFgd, CachedChoicesFollowCommitsAndReleases) {
  // The per-shape cache must see changes made by Commit and Release as well as by Place.
  const Cluster cluster = Uniform(2, 1);
  Allocator allocator(cluster);
  allocator.SetTargetWorkload({Class(600)});
  const JobSpec small = GpuJob(1, 1, 100);
  const JobSpec other = GpuJob(100, 1, 400);
  allocator.Commit(other, {Task(0, {0}, 400)});
  auto placed = allocator.Place(small, PlacementPolicy::kFgd);
  EXPECT_EQ(*placed, Allocation{Task(1, {0}, 100)});
  allocator.Release(small, *placed);
  allocator.Release(other, {Task(0, {0}, 400)});
  allocator.Commit(other, {Task(1, {0}, 400)});  // now node 1 is the one with 600 free
  placed = allocator.Place(small, PlacementPolicy::kFgd);
  EXPECT_EQ(*placed, Allocation{Task(0, {0}, 100)});
}

TEST(ScheduleFgd, TheTargetWorkloadComesFromTheConfig) {
  const Cluster cluster = Uniform(2, 1);
  RunningJob running;
  running.spec = GpuJob(100, 1, 400);
  running.allocation = {Task(0, {0}, 400)};
  PendingJob pending;
  pending.spec = GpuJob(1, 1, 100);
  SchedulerConfig config;
  config.placement = PlacementPolicy::kFgd;
  config.target_workload = {Class(600)};
  Decisions decisions = Schedule(cluster, {&running, 1}, {&pending, 1}, 0, config);
  ASSERT_EQ(decisions.placements.size(), 1u);
  EXPECT_EQ(decisions.placements[0].allocation, Allocation{Task(1, {0}, 100)});
  config.placement = PlacementPolicy::kBinPack;
  decisions = Schedule(cluster, {&running, 1}, {&pending, 1}, 0, config);
  ASSERT_EQ(decisions.placements.size(), 1u);
  EXPECT_EQ(decisions.placements[0].allocation, Allocation{Task(0, {0}, 100)});
}

TEST(TargetWorkload, OneClassPerTaskShapeWeightedByTasks) {
  JobSpec a = GpuJob(1, 2, 500);
  JobSpec b = GpuJob(2, 1, 500);
  JobSpec c = GpuJob(3, 1, 500);
  c.cpu_milli_per_task = 4000;  // another shape
  const std::vector<JobSpec> jobs = {a, b, c, WholeGpus(4, 8)};
  const std::vector<TaskClass> classes = TargetWorkloadOf(jobs);
  ASSERT_EQ(classes.size(), 3u);
  EXPECT_EQ(classes[0], Class(500, 3));
  EXPECT_EQ(classes[1], Class(500, 1, 4000));
  EXPECT_EQ(classes[2], Class(8000, 1));
  // Weighed by GPUs: a task of k whole GPUs counts k times, any other task once.
  const std::vector<TaskClass> by_gpus = TargetWorkloadOf(jobs, WorkloadWeight::kGpus);
  ASSERT_EQ(by_gpus.size(), 3u);
  EXPECT_EQ(by_gpus[0].weight, 3);
  EXPECT_EQ(by_gpus[1].weight, 1);
  EXPECT_EQ(by_gpus[2].weight, 8);
  EXPECT_EQ(ParseWorkloadWeight("gpus"), WorkloadWeight::kGpus);
  EXPECT_STREQ(Name(WorkloadWeight::kTasks), "tasks");
  EXPECT_EQ(ParsePlacementPolicy("fgd"), PlacementPolicy::kFgd);
  EXPECT_STREQ(Name(PlacementPolicy::kFgd), "fgd");
}

}  // namespace
}  // namespace gpufleet::sched
