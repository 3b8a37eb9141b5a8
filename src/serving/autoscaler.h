#pragma once

// The pure autoscaling core for inference deployments (docs/autoscaling.md). Like sched, it does
// no I/O and reads no clock: load comes in as LoadSamples stamped with the caller's time, and a
// decision is asked for at a given time. The server's deployment controller and the simulator
// (`gpufleet sim --serving`) run this same code.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::serving {

// What a replica's target is expressed in.
enum class ScaleMetric {
  kConcurrency,  // requests in flight (being served or waiting at the gateway), per replica
  kRps,          // arriving requests per second, per replica
};

std::string_view ScaleMetricName(ScaleMetric metric);
std::optional<ScaleMetric> ParseScaleMetric(std::string_view name);
std::vector<std::string> ScaleMetricNames();

// Knative's KPA settings, with Knative's defaults (config-autoscaler) except `target` (Knative's
// container-concurrency-target-default is 100, meant for CPU web servers; a GPU model server
// typically takes a handful of requests at once).
struct AutoscalerConfig {
  ScaleMetric metric = ScaleMetric::kConcurrency;
  double target = 1.0;              // per replica: in-flight requests, or requests/s
  double target_utilization = 0.7;  // Knative's container-concurrency-target-percentage
  int32_t min_replicas = 0;
  int32_t max_replicas = 1;
  TimeMs stable_window_ms = 60000;
  TimeMs panic_window_ms = 6000;  // Knative: 10 % of the stable window
  double panic_threshold = 2.0;   // panic when the panic-window desired >= 2x current ready
  double max_scale_up_rate = 1000.0;
  double max_scale_down_rate = 2.0;
  TimeMs scale_to_zero_grace_ms = 30000;
  TimeMs scale_down_delay_ms = 0;
};

// Why the config is invalid (one sentence naming the field), or nothing when it is valid.
std::optional<std::string> ValidateAutoscalerConfig(const AutoscalerConfig& config);

// What the gateways observed over (time_ms - interval_ms, time_ms]. Several samples for the same
// interval (one per gateway) add up: the autoscaler integrates them over time.
struct LoadSample {
  TimeMs time_ms = 0;
  TimeMs interval_ms = 0;
  double concurrency = 0;  // time-averaged in-flight requests, including those buffered
  double arrivals = 0;     // requests that arrived in the interval
};

struct ScaleDecision {
  int32_t desired = 0;
  bool panicking = false;
  double stable_value = 0;  // the metric averaged over the stable window (whole deployment)
  double panic_value = 0;   // the same over the panic window
  std::string reason;       // a sentence for users
};

// The load history both autoscalers average over: samples are kept as time intervals and the
// average over a window is their time-weighted overlap with it, so samples of any length (and
// from several gateways) combine exactly.
class LoadWindow {
 public:
  void Record(const LoadSample& sample);
  // The metric averaged over (now - window_ms, now]: concurrency time-averaged, or arrivals per
  // second. As Knative's buckets do, a window that reaches back before the first sample is
  // shortened to start at that sample, so a fresh history is not diluted by time it never saw;
  // gaps after it count as zero load.
  double Average(ScaleMetric metric, TimeMs now, TimeMs window_ms) const;
  // Whether any sample with load (concurrency or arrivals above 0) overlaps (from, now].
  bool TrafficSince(TimeMs from) const;
  // End of the last sample with load, if any.
  std::optional<TimeMs> last_traffic_ms() const { return last_traffic_ms_; }
  // Drops samples that ended at or before `before`.
  void Forget(TimeMs before);

 private:
  std::deque<LoadSample> samples_;  // in the order recorded
  std::optional<TimeMs> first_start_ms_;
  std::optional<TimeMs> last_traffic_ms_;
};

// Knative's KPA (pkg/autoscaler/scaling/autoscaler.go, plus the scale-to-zero and min/max rules of
// its reconciler): a value holding all its state, no clock. Call Record for every sample and
// Decide once per autoscaler tick (Decide advances the panic and scale-down-delay state).
class KpaAutoscaler {
 public:
  // The config must be valid (ValidateAutoscalerConfig); throws std::invalid_argument otherwise.
  explicit KpaAutoscaler(AutoscalerConfig config);

  void Record(const LoadSample& sample);
  ScaleDecision Decide(TimeMs now, int32_t ready_replicas);
  const AutoscalerConfig& config() const { return config_; }

 private:
  AutoscalerConfig config_;
  LoadWindow load_;
  std::optional<TimeMs> panic_since_ms_;  // last time the panic threshold was crossed
  int32_t max_panic_replicas_ = 0;
  std::deque<std::pair<TimeMs, int32_t>> delay_window_;  // (time, desired) for scale-down delay
  std::optional<TimeMs> zero_wanted_since_ms_;           // start of the current run of desired 0
};

// The baseline: a cloud-style target-tracking policy (AWS Application Auto Scaling's target
// tracking, simplified). desired = ceil(metric averaged over one window / target), clamped to
// [min, max]; scale-out at once, scale-in only once `scale_in_cooldown_ms` has passed since the
// last change, no panic mode, no grace period before zero. Same Record/Decide interface as KPA.
struct TargetTrackingConfig {
  ScaleMetric metric = ScaleMetric::kConcurrency;
  double target = 1.0;  // per replica, used as is (no utilization factor)
  int32_t min_replicas = 0;
  int32_t max_replicas = 1;
  TimeMs window_ms = 60000;              // one CloudWatch-style period
  TimeMs scale_in_cooldown_ms = 300000;  // AWS's default scale-in cooldown (300 s)
};

std::optional<std::string> ValidateTargetTrackingConfig(const TargetTrackingConfig& config);

class TargetTrackingAutoscaler {
 public:
  // Throws std::invalid_argument on an invalid config.
  explicit TargetTrackingAutoscaler(TargetTrackingConfig config);

  void Record(const LoadSample& sample);
  ScaleDecision Decide(TimeMs now, int32_t ready_replicas);
  const TargetTrackingConfig& config() const { return config_; }

 private:
  TargetTrackingConfig config_;
  LoadWindow load_;
  std::optional<int32_t> last_desired_;
  TimeMs last_change_ms_ = 0;
};

}  // namespace gpufleet::serving
