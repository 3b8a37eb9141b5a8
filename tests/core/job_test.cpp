#include "core/job.h"

#include <gtest/gtest.h>

namespace gpufleet {
namespace {

JobSpec OneGpuJob() {
  JobSpec spec;
  spec.id = 1;
  spec.tasks = 1;
  spec.gpu_milli_per_task = kMilliPerGpu;
  return spec;
}

TEST(ValidateJobSpec, AcceptsWholeFractionalAndCpuOnlyJobs) {
  JobSpec spec = OneGpuJob();
  EXPECT_FALSE(ValidateJobSpec(spec).has_value());
  spec.gpu_milli_per_task = 8 * kMilliPerGpu;
  spec.tasks = 4;
  EXPECT_FALSE(ValidateJobSpec(spec).has_value());
  spec.gpu_milli_per_task = 250;
  EXPECT_FALSE(ValidateJobSpec(spec).has_value());
  spec.gpu_milli_per_task = 0;
  spec.cpu_milli_per_task = 2000;
  EXPECT_FALSE(ValidateJobSpec(spec).has_value());
}

TEST(ValidateJobSpec, RejectsZeroTasks) {
  JobSpec spec = OneGpuJob();
  spec.tasks = 0;
  ASSERT_TRUE(ValidateJobSpec(spec).has_value());
  EXPECT_NE(ValidateJobSpec(spec)->find("tasks"), std::string::npos);
}

TEST(ValidateJobSpec, RejectsMoreThanOneGpuThatIsNotWhole) {
  JobSpec spec = OneGpuJob();
  spec.gpu_milli_per_task = 1500;
  ASSERT_TRUE(ValidateJobSpec(spec).has_value());
  EXPECT_NE(ValidateJobSpec(spec)->find("1500"), std::string::npos);
}

TEST(ValidateJobSpec, RejectsNegativeQuantities) {
  JobSpec spec = OneGpuJob();
  spec.gpu_milli_per_task = -1000;
  EXPECT_TRUE(ValidateJobSpec(spec).has_value());
  spec = OneGpuJob();
  spec.cpu_milli_per_task = -1;
  EXPECT_TRUE(ValidateJobSpec(spec).has_value());
  spec = OneGpuJob();
  spec.memory_mib_per_task = -1;
  EXPECT_TRUE(ValidateJobSpec(spec).has_value());
  spec = OneGpuJob();
  spec.min_gpu_memory_mib = -1;
  EXPECT_TRUE(ValidateJobSpec(spec).has_value());
  spec = OneGpuJob();
  spec.runtime_estimate = -1;
  EXPECT_TRUE(ValidateJobSpec(spec).has_value());
}

TEST(ValidateJobSpec, RejectsAJobThatAsksForNothing) {
  JobSpec spec = OneGpuJob();
  spec.gpu_milli_per_task = 0;
  ASSERT_TRUE(ValidateJobSpec(spec).has_value());
  EXPECT_NE(ValidateJobSpec(spec)->find("no GPU"), std::string::npos);
}

TEST(JobSpec, FractionalAndWholeGpuHelpers) {
  JobSpec spec = OneGpuJob();
  spec.tasks = 3;
  spec.gpu_milli_per_task = 500;
  EXPECT_TRUE(spec.Fractional());
  EXPECT_EQ(spec.WholeGpusPerTask(), 0);
  EXPECT_EQ(spec.TotalGpuMilli(), 1500);
  spec.gpu_milli_per_task = 4000;
  EXPECT_FALSE(spec.Fractional());
  EXPECT_EQ(spec.WholeGpusPerTask(), 4);
  EXPECT_EQ(spec.TotalGpuMilli(), 12000);
  spec.gpu_milli_per_task = 0;
  EXPECT_FALSE(spec.Fractional());
  EXPECT_EQ(spec.WholeGpusPerTask(), 0);
}

struct GangCase {
  int32_t gpus;
  int32_t gpus_per_node;
  int32_t tasks;
  MilliGpu milli_per_task;
};

class SetGangShapeTest : public testing::TestWithParam<GangCase> {};

TEST_P(SetGangShapeTest, SplitsIntoEqualTasksThatFitANode) {
  const GangCase& c = GetParam();
  JobSpec spec = OneGpuJob();
  spec.tasks = 99;  // overwritten
  SetGangShape(spec, c.gpus, c.gpus_per_node);
  EXPECT_EQ(spec.tasks, c.tasks);
  EXPECT_EQ(spec.gpu_milli_per_task, c.milli_per_task);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SetGangShapeTest,
                         testing::Values(GangCase{16, 8, 2, 8000}, GangCase{12, 8, 2, 6000},
                                         GangCase{7, 8, 1, 7000}, GangCase{0, 8, 1, 0},
                                         GangCase{8, 8, 1, 8000}, GangCase{1, 8, 1, 1000},
                                         GangCase{64, 8, 8, 8000}, GangCase{13, 8, 13, 1000},
                                         GangCase{6, 4, 2, 3000}, GangCase{-3, 8, 1, 0}));

}  // namespace
}  // namespace gpufleet
