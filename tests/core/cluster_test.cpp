#include "core/cluster.h"

#include <gtest/gtest.h>

namespace gpufleet {
namespace {

UniformClusterShape SmallShape() {
  UniformClusterShape shape;
  shape.nodes = 5;
  shape.gpus_per_node = 4;
  shape.nodes_per_rack = 2;
  shape.racks_per_spine = 2;
  shape.gpus_per_nvlink_island = 2;
  shape.gpu_model = "V100M32";
  shape.gpu_memory_mib = 32768;
  shape.cpu_milli_per_node = 64'000;
  shape.memory_mib_per_node = 512 * 1024;
  return shape;
}

TEST(MakeUniformCluster, NamesNodesRacksAndSpinesByPosition) {
  const Cluster cluster = MakeUniformCluster(SmallShape());
  ASSERT_EQ(cluster.nodes.size(), 5u);
  const std::vector<std::string> names = {"node-0000", "node-0001", "node-0002", "node-0003",
                                          "node-0004"};
  // 2 nodes per rack and 2 racks per spine: racks 0,0,1,1,2 and spines 0,0,0,0,1.
  const std::vector<std::string> racks = {"rack-000", "rack-000", "rack-001", "rack-001",
                                          "rack-002"};
  const std::vector<std::string> spines = {"spine-00", "spine-00", "spine-00", "spine-00",
                                           "spine-01"};
  for (size_t n = 0; n < cluster.nodes.size(); ++n) {
    const Node& node = cluster.nodes[n];
    EXPECT_EQ(node.name, names[n]);
    EXPECT_EQ(node.rack, racks[n]) << node.name;
    EXPECT_EQ(node.spine, spines[n]) << node.name;
    EXPECT_EQ(node.cpu_milli, 64'000);
    EXPECT_EQ(node.memory_mib, 512 * 1024);
    EXPECT_TRUE(node.schedulable);
  }
}

TEST(MakeUniformCluster, NumbersGpusAndGroupsThemInNvlinkIslands) {
  const Cluster cluster = MakeUniformCluster(SmallShape());
  const Node& node = cluster.nodes[3];
  ASSERT_EQ(node.gpus.size(), 4u);
  const std::vector<int32_t> islands = {0, 0, 1, 1};
  for (int32_t g = 0; g < 4; ++g) {
    const Gpu& gpu = node.gpus[static_cast<size_t>(g)];
    EXPECT_EQ(gpu.index, g);
    EXPECT_EQ(gpu.nvlink_island, islands[static_cast<size_t>(g)]);
    EXPECT_EQ(gpu.model, "V100M32");
    EXPECT_EQ(gpu.memory_mib, 32768);
    EXPECT_TRUE(gpu.healthy);
  }
  EXPECT_EQ(node.gpus[2].uuid, "GPU-sim-0003-02");
}

TEST(MakeUniformCluster, DefaultShapeIsSixtyFourEightGpuNodesInOneIsland) {
  const Cluster cluster = MakeUniformCluster(UniformClusterShape{});
  ASSERT_EQ(cluster.nodes.size(), 64u);
  EXPECT_EQ(cluster.TotalGpus(), 512);
  EXPECT_EQ(cluster.nodes[15].rack, "rack-000");
  EXPECT_EQ(cluster.nodes[16].rack, "rack-001");
  EXPECT_EQ(cluster.nodes[63].spine, "spine-00");  // 4 racks, 8 per spine
  for (const Gpu& gpu : cluster.nodes[0].gpus)
    EXPECT_EQ(gpu.nvlink_island, 0);
  EXPECT_FALSE(ValidateCluster(cluster).has_value());
}

TEST(Cluster, UsableGpusSkipUnhealthyGpusAndUnschedulableNodes) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  EXPECT_EQ(cluster.TotalGpus(), 20);
  EXPECT_EQ(cluster.UsableGpus(), 20);
  cluster.nodes[1].schedulable = false;
  cluster.nodes[2].gpus[0].healthy = false;
  cluster.nodes[1].gpus[0].healthy = false;  // on the drained node: not counted twice
  EXPECT_EQ(cluster.TotalGpus(), 20);
  EXPECT_EQ(cluster.UsableGpus(), 15);
}

TEST(ValidateCluster, AcceptsAnEmptyCluster) {
  EXPECT_FALSE(ValidateCluster(Cluster{}));
}

TEST(ValidateCluster, RejectsANodeWithoutName) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  cluster.nodes[2].name.clear();
  const auto error = ValidateCluster(cluster);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("no name"), std::string::npos) << *error;
}

TEST(ValidateCluster, RejectsDuplicateNodeNames) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  cluster.nodes[4].name = "node-0001";
  const auto error = ValidateCluster(cluster);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("duplicate node name 'node-0001'"), std::string::npos) << *error;
}

TEST(ValidateCluster, RejectsNegativeCpuOrMemory) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  cluster.nodes[0].cpu_milli = -1;
  ASSERT_TRUE(ValidateCluster(cluster).has_value());
  EXPECT_NE(ValidateCluster(cluster)->find("node-0000"), std::string::npos);

  cluster = MakeUniformCluster(SmallShape());
  cluster.nodes[3].memory_mib = -5;
  ASSERT_TRUE(ValidateCluster(cluster).has_value());
  EXPECT_NE(ValidateCluster(cluster)->find("node-0003"), std::string::npos);
}

TEST(ValidateCluster, RejectsGpuIndexOutOfOrder) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  std::swap(cluster.nodes[1].gpus[0], cluster.nodes[1].gpus[1]);
  const auto error = ValidateCluster(cluster);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("GPU at position 0 has index 1"), std::string::npos) << *error;
}

TEST(ValidateCluster, RejectsNegativeGpuMemory) {
  Cluster cluster = MakeUniformCluster(SmallShape());
  cluster.nodes[2].gpus[3].memory_mib = -1;
  const auto error = ValidateCluster(cluster);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("negative memory"), std::string::npos) << *error;
}

}  // namespace
}  // namespace gpufleet
