// Decayed usage and Slurm's fair-share factor (sched/fair_share.h), and the order they give.
#include "sched/fair_share.h"

#include <cmath>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "sched/scheduler.h"

namespace gpufleet::sched {
namespace {

constexpr int64_t kHour = 3600;
constexpr TimeMs kHourMs = kHour * kMsPerSecond;

TEST(FairShareLedger, SpanEndingNowCountsAlmostInFull) {
  FairShareLedger ledger(100 * kHour);
  ledger.AddSpan("a", 2, 0, kHourMs);
  const auto usage = ledger.UsageAt(kHourMs, {});
  // 2 GPU-hours, decayed by at most 2^(-1/100) at the span's far end.
  EXPECT_LT(usage.at("a"), 2.0 * 3600);
  EXPECT_GT(usage.at("a"), 2.0 * 3600 * std::exp2(-0.01));
}

TEST(FairShareLedger, HalvesEveryHalfLife) {
  FairShareLedger ledger(kHour);
  ledger.AddSpan("a", 1, 0, kHourMs);
  const double at_end = ledger.UsageAt(kHourMs, {}).at("a");
  // The integral of 2^-(t - s)/h over one half-life: h / ln 2 x (1 - 1/2).
  EXPECT_NEAR(at_end, 3600 / std::numbers::ln2 * 0.5, 1e-6);
  EXPECT_NEAR(ledger.UsageAt(2 * kHourMs, {}).at("a"), at_end / 2, 1e-6);
  EXPECT_NEAR(ledger.UsageAt(11 * kHourMs, {}).at("a"), at_end / 1024, 1e-6);
}

TEST(FairShareLedger, OrderOfSpansDoesNotMatter) {
  FairShareLedger forward(6 * kHour), backward(6 * kHour);
  const std::vector<std::pair<TimeMs, TimeMs>> spans = {
      {0, 3 * kHourMs}, {kHourMs, 10 * kHourMs}, {20 * kHourMs, 21 * kHourMs}};
  for (const auto& [start, end] : spans)
    forward.AddSpan("a", 4, start, end);
  for (auto it = spans.rbegin(); it != spans.rend(); ++it)
    backward.AddSpan("a", 4, it->first, it->second);
  EXPECT_NEAR(forward.UsageAt(30 * kHourMs, {}).at("a"), backward.UsageAt(30 * kHourMs, {}).at("a"),
              1e-6);
}

TEST(FairShareLedger, OpenSpanCountsAsClosedNow) {
  FairShareLedger closed(kHour), open(kHour);
  closed.AddSpan("a", 8, kHourMs, 3 * kHourMs);
  const std::vector<OpenSpan> running = {{.queue = "a", .gpus = 8, .start = kHourMs}};
  EXPECT_NEAR(closed.UsageAt(3 * kHourMs, {}).at("a"), open.UsageAt(3 * kHourMs, running).at("a"),
              1e-6);
  EXPECT_FALSE(open.UsageAt(3 * kHourMs, {}).contains("a"));
}

// Open/Close keep the running spans in O(queues); they must value usage exactly as the spans
// listed at each call do, over many overlapping starts and stops in random order of queues.
TEST(FairShareLedger, KeptOpenSpansMatchListedOnes) {
  FairShareLedger kept(2 * kHour), listed(2 * kHour);
  std::vector<OpenSpan> open;
  const std::vector<std::string> queues = {"a", "b", "c"};
  uint64_t state = 12345;
  auto next = [&](uint64_t bound) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % bound;
  };
  TimeMs now = 0;
  for (int step = 0; step < 2000; ++step) {
    now += static_cast<TimeMs>(next(20 * 60)) * kMsPerSecond;
    if (open.empty() || next(3) != 0) {
      const OpenSpan span{
          .queue = queues[next(3)], .gpus = 0.5 * static_cast<double>(1 + next(16)), .start = now};
      kept.Open(span.queue, span.gpus, span.start);
      open.push_back(span);
    } else {
      const size_t which = next(open.size());
      const OpenSpan span = open[which];
      kept.Close(span.queue, span.gpus, span.start, now);
      listed.AddSpan(span.queue, span.gpus, span.start, now);
      open.erase(open.begin() + static_cast<ptrdiff_t>(which));
    }
    if (step % 50 != 0) continue;
    const auto expected = listed.UsageAt(now, open);
    const auto got = kept.UsageAt(now);
    for (const auto& [queue, value] : expected)
      EXPECT_NEAR(got.contains(queue) ? got.at(queue) : 0.0, value, 1e-6 * (1 + value))
          << queue << " at step " << step;
  }
}

TEST(FairShareFactors, SlurmClassicFormula) {
  // Equal weights (no configured queues): one that used its share exactly gets 0.5.
  auto factors = FairShareFactors({{"a", 50.0}, {"b", 50.0}}, {});
  EXPECT_DOUBLE_EQ(factors.at("a"), 0.5);
  EXPECT_DOUBLE_EQ(factors.at("b"), 0.5);
  factors = FairShareFactors({{"a", 100.0}, {"b", 0.0}}, {});
  EXPECT_DOUBLE_EQ(factors.at("a"), 0.25);  // 2^-(1 / 0.5)
  EXPECT_DOUBLE_EQ(factors.at("b"), 1.0);

  std::vector<QueueConfig> queues(3);
  queues[0].name = "a";
  queues[0].weight = 3;
  queues[1].name = "b";
  queues[1].weight = 1;
  queues[2].name = "idle";
  queues[2].weight = 4;
  factors = FairShareFactors({{"a", 60.0}, {"b", 40.0}}, queues);
  EXPECT_NEAR(factors.at("a"), std::exp2(-0.6 / 0.375), 1e-12);
  EXPECT_NEAR(factors.at("b"), std::exp2(-0.4 / 0.125), 1e-12);
  EXPECT_DOUBLE_EQ(factors.at("idle"), 1.0);
  // Nothing used at all: everyone is owed their share.
  factors = FairShareFactors({}, queues);
  EXPECT_DOUBLE_EQ(factors.at("a"), 1.0);
}

// The order follows the factors: the queue that used less goes first, whatever the submit order,
// and recovers as its usage decays.
TEST(FairShareOrder, LessRecentUsageGoesFirst) {
  UniformClusterShape shape;
  shape.nodes = 1;
  const Cluster cluster = MakeUniformCluster(shape);
  SchedulerConfig config;
  config.order = QueueOrder::kFairShare;
  config.backfill = Backfill::kFirstFit;
  PendingJob heavy, light;
  heavy.spec.id = 1;
  heavy.spec.queue = "heavy";
  heavy.spec.gpu_milli_per_task = 8 * kMilliPerGpu;
  heavy.spec.submit_time = 0;
  light.spec = heavy.spec;
  light.spec.id = 2;
  light.spec.queue = "light";
  light.spec.submit_time = 1000;
  const std::vector<PendingJob> pending = {heavy, light};

  FairShareLedger ledger(kHour);
  ledger.AddSpan("heavy", 8, 0, 10 * kHourMs);
  ledger.AddSpan("light", 8, 0, kHourMs);
  config.fair_share_factor = FairShareFactors(ledger.UsageAt(10 * kHourMs, {}), {});
  Decisions decisions = Schedule(cluster, {}, pending, 10 * kHourMs, config);
  ASSERT_EQ(decisions.placements.size(), 1u);
  EXPECT_EQ(decisions.placements[0].job, 2u);

  // Without fair share, submit order decides.
  config.order = QueueOrder::kFifo;
  decisions = Schedule(cluster, {}, pending, 10 * kHourMs, config);
  ASSERT_EQ(decisions.placements.size(), 1u);
  EXPECT_EQ(decisions.placements[0].job, 1u);
}

}  // namespace
}  // namespace gpufleet::sched
