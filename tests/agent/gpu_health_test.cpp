// Health verdicts from samples and XID events: which conditions make a GPU unhealthy, which are
// sticky, and the reasons people read. The last tests drive them through the simulator's faults.
#include "agent/gpu_health.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/sim_gpu_backend.h"

namespace gpufleet::agent {
namespace {

using ::testing::ElementsAre;

GpuInfo Gpu(std::string uuid = "GPU-a") {
  GpuInfo info;
  info.uuid = std::move(uuid);
  info.xid_events_supported = true;
  return info;
}

GpuSample HealthySample() {
  GpuSample sample;
  sample.temperature_c = 60;
  sample.ecc_double_bit_volatile = 0;
  sample.remapped_rows = RemappedRows{};
  return sample;
}

XidEvent Xid(uint64_t code, std::string uuid = "GPU-a") {
  return XidEvent{0, std::move(uuid), code, 0};
}

TEST(GpuHealthTest, ANormalSampleIsHealthy) {
  GpuHealthTracker tracker;
  const GpuHealth health = tracker.Evaluate(Gpu(), HealthySample(), {});
  EXPECT_TRUE(health.healthy);
  EXPECT_THAT(health.reasons, ElementsAre());
  EXPECT_EQ(health.Reason(), "");
  EXPECT_EQ(health.last_xid, std::nullopt);
}

TEST(GpuHealthTest, ApplicationXidsAreRecordedButDoNotMakeTheGpuUnhealthy) {
  GpuHealthTracker tracker;
  for (uint64_t xid : {13, 31, 43, 45, 68, 109}) {
    const std::vector<XidEvent> events{Xid(xid)};
    const GpuHealth health = tracker.Evaluate(Gpu(), HealthySample(), events);
    EXPECT_TRUE(health.healthy) << xid;
    EXPECT_EQ(health.last_xid, xid);
  }
}

TEST(GpuHealthTest, HardwareXidIsStickyUntilCleared) {
  GpuHealthTracker tracker;
  const std::vector<XidEvent> events{Xid(79), Xid(13), Xid(79), Xid(48)};
  GpuHealth health = tracker.Evaluate(Gpu(), HealthySample(), events);
  EXPECT_FALSE(health.healthy);
  EXPECT_THAT(health.reasons,
              ElementsAre("XID 79: GPU has fallen off the bus", "XID 48: double-bit ECC error"));
  EXPECT_EQ(health.Reason(), "XID 79: GPU has fallen off the bus; XID 48: double-bit ECC error");
  EXPECT_EQ(health.last_xid, 48U);

  health = tracker.Evaluate(Gpu(), HealthySample(), {});  // next cycle, no new events
  EXPECT_FALSE(health.healthy);
  EXPECT_EQ(health.reasons.size(), 2U);

  EXPECT_TRUE(tracker.ClearSticky("GPU-a"));
  health = tracker.Evaluate(Gpu(), HealthySample(), {});
  EXPECT_TRUE(health.healthy);
  EXPECT_EQ(health.last_xid, 48U);  // history stays for DCGM_FI_DEV_XID_ERRORS
  EXPECT_FALSE(tracker.ClearSticky("GPU-a"));
  EXPECT_FALSE(tracker.ClearSticky("GPU-never-seen"));
}

TEST(GpuHealthTest, UnknownXidsStillCount) {
  GpuHealthTracker tracker;
  const std::vector<XidEvent> events{Xid(999)};
  EXPECT_THAT(tracker.Evaluate(Gpu(), HealthySample(), events).reasons, ElementsAre("XID 999"));
}

TEST(GpuHealthTest, OtherGpusEventsDoNotCount) {
  GpuHealthTracker tracker;
  const std::vector<XidEvent> events{Xid(79, "GPU-b")};
  const GpuHealth health = tracker.Evaluate(Gpu("GPU-a"), HealthySample(), events);
  EXPECT_TRUE(health.healthy);
  EXPECT_EQ(health.last_xid, std::nullopt);
  EXPECT_FALSE(tracker.Evaluate(Gpu("GPU-b"), HealthySample(), events).healthy);
}

TEST(GpuHealthTest, ApplicationXidListIsConfigurable) {
  GpuHealthConfig config;
  config.application_xids = {79};
  GpuHealthTracker tracker(config);
  const std::vector<XidEvent> events{Xid(79), Xid(13)};
  EXPECT_THAT(tracker.Evaluate(Gpu(), HealthySample(), events).reasons,
              ElementsAre("XID 13: graphics engine exception"));
}

TEST(GpuHealthTest, DoubleBitEccIsStickyAndComesBackIfTheCounterWasNotReset) {
  GpuHealthTracker tracker;
  GpuSample sample = HealthySample();
  sample.ecc_double_bit_volatile = 1;
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("1 uncorrectable (double-bit) ECC error"));
  sample.ecc_double_bit_volatile = 3;
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("3 uncorrectable (double-bit) ECC errors"));
  // The counter drops (driver reload) but nobody cleared the GPU: still unhealthy.
  EXPECT_FALSE(tracker.Evaluate(Gpu(), HealthySample(), {}).healthy);
  // Cleared while the counter still shows errors: the next sample marks it again.
  EXPECT_TRUE(tracker.ClearSticky("GPU-a"));
  EXPECT_FALSE(tracker.Evaluate(Gpu(), sample, {}).healthy);
  EXPECT_TRUE(tracker.ClearSticky("GPU-a"));
  EXPECT_TRUE(tracker.Evaluate(Gpu(), HealthySample(), {}).healthy);
}

TEST(GpuHealthTest, RowRemapsFollowTheLatestSample) {
  GpuHealthTracker tracker;
  GpuSample sample = HealthySample();
  sample.remapped_rows = RemappedRows{0, 1, true, false};
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("row remapping pending: the GPU needs a reset"));
  sample.remapped_rows = RemappedRows{0, 0, false, true};
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("row remapping failed: the memory has no spare rows left"));
  // Remapped rows that are in place (nothing pending, no failure) are fine.
  sample.remapped_rows = RemappedRows{3, 2, false, false};
  EXPECT_TRUE(tracker.Evaluate(Gpu(), sample, {}).healthy);
}

TEST(GpuHealthTest, LostGpu) {
  GpuHealthTracker tracker;
  GpuSample sample;
  sample.status = SampleStatus::kGpuLost;
  sample.error = "nvmlDeviceGetUtilizationRates: GPU is lost (NVML error 15)";
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("GPU lost: nvmlDeviceGetUtilizationRates: GPU is lost (NVML error 15)"));
}

TEST(GpuHealthTest, ThermalLimitIsExclusiveAndConfigurable) {
  GpuHealthTracker tracker;
  GpuSample sample = HealthySample();
  sample.temperature_c = 90;
  EXPECT_TRUE(tracker.Evaluate(Gpu(), sample, {}).healthy);
  sample.temperature_c = 91;
  EXPECT_THAT(tracker.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("temperature 91 C is over the 90 C limit"));
  GpuHealthConfig config;
  config.max_temperature_c = 80;
  GpuHealthTracker strict(config);
  sample.temperature_c = 85;
  EXPECT_THAT(strict.Evaluate(Gpu(), sample, {}).reasons,
              ElementsAre("temperature 85 C is over the 80 C limit"));
}

TEST(GpuHealthTest, SeveralProblemsAreAllListed) {
  GpuHealthTracker tracker;
  GpuSample sample = HealthySample();
  sample.temperature_c = 99;
  sample.ecc_double_bit_volatile = 2;
  const std::vector<XidEvent> events{Xid(94)};
  EXPECT_EQ(tracker.Evaluate(Gpu(), sample, events).Reason(),
            "XID 94: contained ECC error; 2 uncorrectable (double-bit) ECC errors; "
            "temperature 99 C is over the 90 C limit");
}

TEST(GpuHealthTest, UnsupportedFieldsAreNotProblems) {
  GpuHealthTracker tracker;
  EXPECT_TRUE(tracker.Evaluate(Gpu(), GpuSample{}, {}).healthy);  // nothing supported at all
}

// --- simulator faults through to verdicts
// ---------------------------------------------------------

class SimHealthTest : public ::testing::Test {
 protected:
  GpuHealth Check(int32_t gpu) {
    const std::vector<XidEvent> events = backend_.PollEvents(0);
    return tracker_.Evaluate(inventory_.gpus[static_cast<size_t>(gpu)], backend_.Sample(gpu, 0),
                             events);
  }

  SimGpuBackend backend_{ParseSimGpuSpec("4xH100-80GB")};
  GpuInventory inventory_ = backend_.Discover();
  GpuHealthTracker tracker_;
};

TEST_F(SimHealthTest, EachInjectedFaultGivesItsReason) {
  for (int32_t gpu = 0; gpu < 4; ++gpu)
    EXPECT_TRUE(Check(gpu).healthy) << gpu;

  ASSERT_EQ(backend_.InjectXid(0, 31), std::nullopt);  // application XID: ignored
  EXPECT_TRUE(Check(0).healthy);
  ASSERT_EQ(backend_.InjectXid(0, 79), std::nullopt);
  EXPECT_THAT(Check(0).reasons, ElementsAre("XID 79: GPU has fallen off the bus"));

  ASSERT_EQ(backend_.InjectEcc(1, 1), std::nullopt);
  EXPECT_THAT(Check(1).reasons, ElementsAre("1 uncorrectable (double-bit) ECC error"));

  ASSERT_EQ(backend_.MarkLost(2), std::nullopt);
  EXPECT_THAT(Check(2).reasons,
              ElementsAre("GPU lost: GPU has fallen off the bus (simulated fault)"));

  ASSERT_EQ(backend_.SetTemperatureOverride(3, 96), std::nullopt);
  EXPECT_THAT(Check(3).reasons, ElementsAre("temperature 96 C is over the 90 C limit"));

  // A reset (ClearFaults) fixes what the sample shows; the sticky verdicts need ClearSticky.
  for (int32_t gpu = 0; gpu < 4; ++gpu)
    ASSERT_EQ(backend_.ClearFaults(gpu), std::nullopt);
  EXPECT_FALSE(Check(0).healthy);
  EXPECT_FALSE(Check(1).healthy);
  EXPECT_TRUE(Check(2).healthy);
  EXPECT_TRUE(Check(3).healthy);
  tracker_.ClearSticky(inventory_.gpus[0].uuid);
  tracker_.ClearSticky(inventory_.gpus[1].uuid);
  EXPECT_TRUE(Check(0).healthy);
  EXPECT_TRUE(Check(1).healthy);
}

TEST_F(SimHealthTest, PendingRowRemapFromTheSimulator) {
  ASSERT_EQ(backend_.InjectRowRemap(1, true, false), std::nullopt);
  EXPECT_THAT(Check(1).reasons, ElementsAre("row remapping pending: the GPU needs a reset"));
}

}  // namespace
}  // namespace gpufleet::agent
