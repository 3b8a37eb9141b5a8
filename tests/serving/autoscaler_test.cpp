// Unit and property tests of the autoscalers (serving/autoscaler.h). The scenario files in
// scenarios/ pin exact decisions; these check the rules over many random load histories.
#include "serving/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace gpufleet::serving {
namespace {

TEST(ScaleMetric, NamesRoundTrip) {
  for (const std::string& name : ScaleMetricNames())
    EXPECT_EQ(ScaleMetricName(*ParseScaleMetric(name)), name);
  EXPECT_FALSE(ParseScaleMetric("qps"));
}

TEST(AutoscalerConfig, DefaultsAreKnativesAndValid) {
  const AutoscalerConfig config;
  EXPECT_FALSE(ValidateAutoscalerConfig(config));
  EXPECT_EQ(config.stable_window_ms, 60000);
  EXPECT_EQ(config.panic_window_ms, 6000);
  EXPECT_DOUBLE_EQ(config.panic_threshold, 2.0);
  EXPECT_DOUBLE_EQ(config.target_utilization, 0.7);
  EXPECT_EQ(config.scale_to_zero_grace_ms, 30000);
}

TEST(AutoscalerConfig, RejectsEachBadField) {
  auto bad = [](auto change) {
    AutoscalerConfig config;
    config.max_replicas = 4;
    change(config);
    return ValidateAutoscalerConfig(config).value_or("");
  };
  EXPECT_NE(bad([](auto& c) { c.target = 0; }).find("target"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.target = NAN; }).find("target"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.target_utilization = 1.5; }).find("utilization"),
            std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.min_replicas = -1; }).find("min_replicas"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.max_replicas = 0; }).find("max_replicas"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.min_replicas = 5; }).find("below min_replicas"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.panic_window_ms = 70000; }).find("panic_window"),
            std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.stable_window_ms = 0; }).find("stable_window"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.panic_threshold = 1.0; }).find("panic_threshold"),
            std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.max_scale_up_rate = 1.0; }).find("max_scale_up_rate"),
            std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.max_scale_down_rate = 0.5; }).find("max_scale_down_rate"),
            std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.scale_to_zero_grace_ms = -1; }).find("grace"), std::string::npos);
  EXPECT_NE(bad([](auto& c) { c.scale_down_delay_ms = -1; }).find("delay"), std::string::npos);
  AutoscalerConfig invalid;
  invalid.target = -1;
  EXPECT_THROW(KpaAutoscaler{invalid}, std::invalid_argument);
  TargetTrackingConfig tt;
  tt.max_replicas = 0;
  EXPECT_TRUE(ValidateTargetTrackingConfig(tt));
  EXPECT_THROW(TargetTrackingAutoscaler{tt}, std::invalid_argument);
}

TEST(LoadWindow, TimeWeightedAverageOverTheWindow) {
  LoadWindow window;
  window.Record({.time_ms = 10000, .interval_ms = 10000, .concurrency = 2, .arrivals = 20});
  window.Record({.time_ms = 20000, .interval_ms = 10000, .concurrency = 4, .arrivals = 0});
  // A window longer than the history is shortened to start at the first sample.
  EXPECT_DOUBLE_EQ(window.Average(ScaleMetric::kConcurrency, 20000, 60000), 3.0);
  EXPECT_DOUBLE_EQ(window.Average(ScaleMetric::kRps, 20000, 60000), 1.0);
  // Half of the first sample and all of the second: (2 x 5 + 4 x 10) / 15.
  EXPECT_DOUBLE_EQ(window.Average(ScaleMetric::kConcurrency, 20000, 15000), 50.0 / 15.0);
  EXPECT_DOUBLE_EQ(window.Average(ScaleMetric::kRps, 20000, 15000), 10.0 / 15.0);
  // Time after the last sample counts as no load.
  EXPECT_DOUBLE_EQ(window.Average(ScaleMetric::kConcurrency, 30000, 20000), 2.0);
  EXPECT_TRUE(window.TrafficSince(19999));
  EXPECT_FALSE(window.TrafficSince(20000));
}

TEST(LoadWindow, SamplesFromSeveralGatewaysAddUp) {
  LoadWindow one, two;
  one.Record({.time_ms = 2000, .interval_ms = 2000, .concurrency = 3, .arrivals = 6});
  two.Record({.time_ms = 2000, .interval_ms = 2000, .concurrency = 1, .arrivals = 2});
  two.Record({.time_ms = 2000, .interval_ms = 2000, .concurrency = 2, .arrivals = 4});
  for (ScaleMetric metric : {ScaleMetric::kConcurrency, ScaleMetric::kRps})
    EXPECT_DOUBLE_EQ(one.Average(metric, 2000, 6000), two.Average(metric, 2000, 6000));
}

TEST(LoadWindow, OneLongIdleSampleEqualsManyShortOnes) {
  // The simulator skips ticks of an idle deployment and records the gap as one sample.
  LoadWindow ticks, gap;
  for (TimeMs t = 2000; t <= 100000; t += 2000) {
    const double load = t <= 10000 ? 5 : 0;
    ticks.Record({.time_ms = t, .interval_ms = 2000, .concurrency = load, .arrivals = load});
    if (t <= 10000)
      gap.Record({.time_ms = t, .interval_ms = 2000, .concurrency = 5, .arrivals = 5});
  }
  gap.Record({.time_ms = 100000, .interval_ms = 90000});
  for (TimeMs now : {60000, 70000, 100000})
    for (ScaleMetric metric : {ScaleMetric::kConcurrency, ScaleMetric::kRps})
      EXPECT_DOUBLE_EQ(ticks.Average(metric, now, 60000), gap.Average(metric, now, 60000));
}

TEST(Kpa, ActivatorPathFromZero) {
  AutoscalerConfig config;
  config.max_replicas = 3;
  config.target = 100;  // a tiny load against a large target still needs one replica
  KpaAutoscaler kpa(config);
  kpa.Record({.time_ms = 2000, .interval_ms = 2000, .concurrency = 0, .arrivals = 0});
  EXPECT_EQ(kpa.Decide(2000, 0).desired, 0);
  kpa.Record({.time_ms = 4000, .interval_ms = 2000, .concurrency = 0.001, .arrivals = 1});
  const ScaleDecision decision = kpa.Decide(4000, 0);
  EXPECT_EQ(decision.desired, 1);
  EXPECT_FALSE(decision.reason.empty());
}

TEST(Kpa, ArrivalsAloneWakeAConcurrencyScaledDeployment) {
  AutoscalerConfig config;
  config.max_replicas = 3;
  KpaAutoscaler kpa(config);
  kpa.Record({.time_ms = 2000, .interval_ms = 2000, .concurrency = 0, .arrivals = 1});
  EXPECT_EQ(kpa.Decide(2000, 0).desired, 1);
}

// Random bursty load; replicas become ready some ticks after they are wanted (cold starts).
struct RandomRun {
  AutoscalerConfig config;
  std::vector<LoadSample> samples;
  std::vector<int32_t> lag_ticks;  // per tick: 0 = ready follows desired at once
};

RandomRun MakeRandomRun(uint32_t seed) {
  std::mt19937 random(seed);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(random);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  RandomRun run;
  AutoscalerConfig& c = run.config;
  c.metric = integer(0, 1) ? ScaleMetric::kRps : ScaleMetric::kConcurrency;
  c.target = uniform(0.5, 4);
  c.target_utilization = uniform(0.3, 1.0);
  c.min_replicas = integer(0, 2);
  c.max_replicas = c.min_replicas + integer(1, 30);
  c.stable_window_ms = 2000 * integer(5, 40);
  c.panic_window_ms = std::max<TimeMs>(2000, c.stable_window_ms / integer(2, 10));
  c.panic_threshold = uniform(1.2, 3);
  c.max_scale_up_rate = uniform(1.5, 20);
  c.max_scale_down_rate = uniform(1.5, 4);
  c.scale_to_zero_grace_ms = 2000 * integer(0, 20);
  c.scale_down_delay_ms = integer(0, 1) ? 2000 * integer(1, 10) : 0;
  const int ticks = 600;
  double level = 0;
  for (int tick = 1; tick <= ticks; ++tick) {
    // Idle stretches, steady stretches and bursts.
    const int mode = integer(0, 19);
    if (mode == 0) level = 0;
    if (mode == 1) level = uniform(0, 10);
    if (mode == 2) level = uniform(10, 60);
    const double load = level > 0 ? level * uniform(0.5, 1.5) : 0;
    run.samples.push_back({.time_ms = tick * 2000,
                           .interval_ms = 2000,
                           .concurrency = load,
                           .arrivals = std::round(load)});
    run.lag_ticks.push_back(integer(0, 5));
  }
  return run;
}

TEST(KpaProperty, RulesHoldOverRandomLoads) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const RandomRun run = MakeRandomRun(seed);
    const AutoscalerConfig& c = run.config;
    KpaAutoscaler kpa(c);
    int32_t ready = 0;
    std::vector<int32_t> wanted;  // desired per tick, for the lagging ready count
    std::optional<TimeMs> last_traffic;
    std::optional<ScaleDecision> previous;
    for (size_t i = 0; i < run.samples.size(); ++i) {
      const LoadSample& sample = run.samples[i];
      const TimeMs now = sample.time_ms;
      kpa.Record(sample);
      if (sample.concurrency > 0 || sample.arrivals > 0) last_traffic = now;
      const ScaleDecision d = kpa.Decide(now, ready);
      SCOPED_TRACE(testing::Message() << "t " << now << " ready " << ready << ": " << d.reason);
      ASSERT_GE(d.desired, c.min_replicas);
      ASSERT_LE(d.desired, c.max_replicas);
      if (d.panicking) {
        EXPECT_GE(d.desired, std::min(ready, c.max_replicas)) << "scaled down in panic";
        if (previous && previous->panicking) {
          EXPECT_GE(d.desired, previous->desired);
        }
      }
      if (d.desired == 0 && ready > 0) {
        if (last_traffic) {
          EXPECT_GE(now - *last_traffic, c.stable_window_ms + c.scale_to_zero_grace_ms)
              << "went to zero before the stable window and the grace period";
        }
      }
      if (sample.concurrency > 0 || sample.arrivals > 0) {
        EXPECT_GE(d.desired, 1);
      }
      const double base = std::max(1, ready);
      // Panic and the scale-down delay may hold an earlier, higher desire while ready lags.
      if (!d.panicking && c.scale_down_delay_ms == 0) {
        EXPECT_LE(d.desired,
                  std::max<double>(c.min_replicas, std::ceil(c.max_scale_up_rate * base)));
      }
      EXPECT_GE(d.desired,
                std::min<double>(c.max_replicas, std::floor(base / c.max_scale_down_rate)));
      // Replicas become ready with a lag: what was wanted lag ticks ago.
      wanted.push_back(d.desired);
      const size_t lag = std::min<size_t>(run.lag_ticks[i], wanted.size() - 1);
      ready = wanted[wanted.size() - 1 - lag];
      previous = d;
    }
  }
}

TEST(KpaProperty, SomeRandomRunsPanicAndReachZero) {
  // Guards the property test above against loads too tame to exercise the rules.
  int panicked = 0, zeroed_after_traffic = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    const RandomRun run = MakeRandomRun(seed);
    KpaAutoscaler kpa(run.config);
    int32_t ready = 0;
    bool panics = false, zero = false, had_replicas = false;
    for (const LoadSample& sample : run.samples) {
      kpa.Record(sample);
      const ScaleDecision d = kpa.Decide(sample.time_ms, ready);
      panics |= d.panicking;
      zero |= had_replicas && d.desired == 0;
      had_replicas |= d.desired > 0;
      ready = d.desired;
    }
    panicked += panics;
    zeroed_after_traffic += zero;
  }
  EXPECT_GE(panicked, 50);
  EXPECT_GE(zeroed_after_traffic, 20);
}

TEST(KpaProperty, SameInputSameDecisions) {
  const RandomRun run = MakeRandomRun(7);
  KpaAutoscaler a(run.config), b(run.config);
  int32_t ready = 0;
  for (const LoadSample& sample : run.samples) {
    a.Record(sample);
    b.Record(sample);
    const ScaleDecision da = a.Decide(sample.time_ms, ready);
    const ScaleDecision db = b.Decide(sample.time_ms, ready);
    ASSERT_EQ(da.desired, db.desired);
    ASSERT_EQ(da.reason, db.reason);
    ready = da.desired;
  }
}

TEST(TargetTrackingProperty, BoundsCooldownAndActivation) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const RandomRun run = MakeRandomRun(seed);
    TargetTrackingConfig c;
    c.metric = run.config.metric;
    c.target = run.config.target;
    c.min_replicas = run.config.min_replicas;
    c.max_replicas = run.config.max_replicas;
    c.window_ms = run.config.stable_window_ms;
    c.scale_in_cooldown_ms = run.config.scale_to_zero_grace_ms * 4;
    TargetTrackingAutoscaler tt(c);
    std::optional<int32_t> last;
    TimeMs last_change = 0;
    for (const LoadSample& sample : run.samples) {
      tt.Record(sample);
      const ScaleDecision d = tt.Decide(sample.time_ms, last.value_or(0));
      ASSERT_GE(d.desired, c.min_replicas);
      ASSERT_LE(d.desired, c.max_replicas);
      if (sample.concurrency > 0 || sample.arrivals > 0) {
        EXPECT_GE(d.desired, 1);
      }
      if (last && d.desired < *last) {
        EXPECT_GE(sample.time_ms - last_change, c.scale_in_cooldown_ms) << "scaled in early";
      }
      if (!last || d.desired != *last) last_change = sample.time_ms;
      last = d.desired;
    }
  }
}

}  // namespace
}  // namespace gpufleet::serving
