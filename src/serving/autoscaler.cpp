#include "serving/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace gpufleet::serving {
namespace {

// ceil() of a ratio that floating point may have pushed just above an integer (0.7 / 0.7 * 3
// must give 3 replicas, not 4).
int64_t CeilRatio(double value, double per_replica) {
  const double ratio = value / per_replica;
  return static_cast<int64_t>(std::ceil(ratio - 1e-9));
}

int32_t ClampToInt32(double value) {
  return static_cast<int32_t>(std::clamp(value, 0.0, 2147483647.0));
}

std::string_view Unit(ScaleMetric metric) {
  return metric == ScaleMetric::kConcurrency ? "concurrency" : "requests/s";
}

bool Finite(double value) {
  return std::isfinite(value);
}

}  // namespace

std::string_view ScaleMetricName(ScaleMetric metric) {
  switch (metric) {
    case ScaleMetric::kConcurrency:
      return "concurrency";
    case ScaleMetric::kRps:
      return "rps";
  }
  return "unknown";
}

std::optional<ScaleMetric> ParseScaleMetric(std::string_view name) {
  if (name == "concurrency") return ScaleMetric::kConcurrency;
  if (name == "rps") return ScaleMetric::kRps;
  return std::nullopt;
}

std::vector<std::string> ScaleMetricNames() {
  return {"concurrency", "rps"};
}

std::optional<std::string> ValidateAutoscalerConfig(const AutoscalerConfig& config) {
  if (!Finite(config.target) || config.target <= 0)
    return fmt::format("target must be above 0 (got {})", config.target);
  if (!Finite(config.target_utilization) || config.target_utilization <= 0 ||
      config.target_utilization > 1)
    return fmt::format("target_utilization must be in (0, 1] (got {})", config.target_utilization);
  if (config.min_replicas < 0)
    return fmt::format("min_replicas must be 0 or more (got {})", config.min_replicas);
  if (config.max_replicas < 1)
    return fmt::format("max_replicas must be at least 1 (got {})", config.max_replicas);
  if (config.max_replicas < config.min_replicas)
    return fmt::format("max_replicas ({}) is below min_replicas ({})", config.max_replicas,
                       config.min_replicas);
  if (config.stable_window_ms <= 0)
    return fmt::format("stable_window_ms must be above 0 (got {})", config.stable_window_ms);
  if (config.panic_window_ms <= 0 || config.panic_window_ms > config.stable_window_ms)
    return fmt::format("panic_window_ms must be in (0, stable_window_ms = {}] (got {})",
                       config.stable_window_ms, config.panic_window_ms);
  // Knative's bounds: a threshold at or below 1 would panic at steady state.
  if (!Finite(config.panic_threshold) || config.panic_threshold <= 1)
    return fmt::format("panic_threshold must be above 1 (got {})", config.panic_threshold);
  if (!Finite(config.max_scale_up_rate) || config.max_scale_up_rate <= 1)
    return fmt::format("max_scale_up_rate must be above 1 (got {})", config.max_scale_up_rate);
  if (!Finite(config.max_scale_down_rate) || config.max_scale_down_rate <= 1)
    return fmt::format("max_scale_down_rate must be above 1 (got {})", config.max_scale_down_rate);
  if (config.scale_to_zero_grace_ms < 0)
    return fmt::format("scale_to_zero_grace_ms must be 0 or more (got {})",
                       config.scale_to_zero_grace_ms);
  if (config.scale_down_delay_ms < 0)
    return fmt::format("scale_down_delay_ms must be 0 or more (got {})",
                       config.scale_down_delay_ms);
  return std::nullopt;
}

// ---- LoadWindow ----

void LoadWindow::Record(const LoadSample& sample) {
  const TimeMs interval = std::max<TimeMs>(0, sample.interval_ms);
  LoadSample kept = sample;
  kept.interval_ms = interval;
  kept.concurrency = Finite(sample.concurrency) ? std::max(0.0, sample.concurrency) : 0.0;
  kept.arrivals = Finite(sample.arrivals) ? std::max(0.0, sample.arrivals) : 0.0;
  const TimeMs start = kept.time_ms - interval;
  if (!first_start_ms_ || start < *first_start_ms_) first_start_ms_ = start;
  if (kept.concurrency > 0 || kept.arrivals > 0)
    last_traffic_ms_ = std::max(last_traffic_ms_.value_or(kept.time_ms), kept.time_ms);
  samples_.push_back(kept);
}

double LoadWindow::Average(ScaleMetric metric, TimeMs now, TimeMs window_ms) const {
  if (!first_start_ms_) return 0;
  const TimeMs start = std::max(now - window_ms, *first_start_ms_);
  if (now <= start) return 0;
  double integral = 0;  // concurrency x ms, or arrivals
  for (const LoadSample& sample : samples_) {
    const TimeMs sample_start = sample.time_ms - sample.interval_ms;
    if (sample.interval_ms == 0) {
      // An instant: its arrivals count when it falls inside the window; it holds no concurrency.
      if (metric == ScaleMetric::kRps && sample.time_ms > start && sample.time_ms <= now)
        integral += sample.arrivals;
      continue;
    }
    const TimeMs overlap = std::min(sample.time_ms, now) - std::max(sample_start, start);
    if (overlap <= 0) continue;
    if (metric == ScaleMetric::kConcurrency)
      integral += sample.concurrency * static_cast<double>(overlap);
    else  // arrivals spread evenly over the sample's interval
      integral +=
          sample.arrivals * static_cast<double>(overlap) / static_cast<double>(sample.interval_ms);
  }
  const auto length = static_cast<double>(now - start);
  return metric == ScaleMetric::kConcurrency ? integral / length : integral * kMsPerSecond / length;
}

bool LoadWindow::TrafficSince(TimeMs from) const {
  return last_traffic_ms_ && *last_traffic_ms_ > from;
}

void LoadWindow::Forget(TimeMs before) {
  while (!samples_.empty() && samples_.front().time_ms <= before)
    samples_.pop_front();
  // A whole window without data restarts the partial-window rule (Knative's bucketing resets
  // its first write the same way).
  if (samples_.empty()) first_start_ms_.reset();
}

// ---- KPA ----

KpaAutoscaler::KpaAutoscaler(AutoscalerConfig config) : config_(config) {
  if (auto why = ValidateAutoscalerConfig(config_)) throw std::invalid_argument(*why);
}

void KpaAutoscaler::Record(const LoadSample& sample) {
  load_.Record(sample);
}

ScaleDecision KpaAutoscaler::Decide(TimeMs now, int32_t ready_replicas) {
  const AutoscalerConfig& c = config_;
  ScaleDecision decision;
  const double per_replica = c.target * c.target_utilization;
  decision.stable_value = load_.Average(c.metric, now, c.stable_window_ms);
  decision.panic_value = load_.Average(c.metric, now, c.panic_window_ms);

  // Knative's Scale(): the rates are relative to the ready replicas, counted as 1 at zero.
  const double ready = std::max(1, ready_replicas);
  const double max_up = std::ceil(c.max_scale_up_rate * ready);
  const double max_down = std::floor(ready / c.max_scale_down_rate);
  auto rate_limited = [&](double wanted) { return std::clamp(wanted, max_down, max_up); };
  const double stable_desired =
      rate_limited(static_cast<double>(CeilRatio(decision.stable_value, per_replica)));
  const double panic_desired =
      rate_limited(static_cast<double>(CeilRatio(decision.panic_value, per_replica)));

  const bool over_threshold = panic_desired / ready >= c.panic_threshold;
  if (over_threshold) {
    if (!panic_since_ms_) max_panic_replicas_ = ready_replicas;
    panic_since_ms_ = now;  // enter, or extend by another stable window
  } else if (panic_since_ms_ && now - *panic_since_ms_ > c.stable_window_ms) {
    panic_since_ms_.reset();
    max_panic_replicas_ = 0;
  }

  double desired = stable_desired;
  std::string reason;
  if (panic_since_ms_) {
    // While panicking, provision for the larger of the two windows and never go down, not even
    // below replicas that became ready since the panic began.
    const double wanted = std::max(panic_desired, stable_desired);
    max_panic_replicas_ =
        std::max({max_panic_replicas_, ClampToInt32(wanted), std::max(0, ready_replicas)});
    desired = max_panic_replicas_;
    decision.panicking = true;
    reason = fmt::format(
        "panic mode: the {} s {} of {:.2f} wants {} replicas ({} ready); no scale-down until {} s "
        "after the last burst",
        static_cast<double>(c.panic_window_ms) / kMsPerSecond, Unit(c.metric), decision.panic_value,
        panic_desired, ready_replicas, static_cast<double>(c.stable_window_ms) / kMsPerSecond);
  } else {
    reason = fmt::format("the {} s {} of {:.2f} at {:.2f} per replica wants {} replicas",
                         static_cast<double>(c.stable_window_ms) / kMsPerSecond, Unit(c.metric),
                         decision.stable_value, per_replica, stable_desired);
  }

  if (c.scale_down_delay_ms > 0) {
    // The highest desire over the delay window wins (Knative's scale-down-delay).
    delay_window_.emplace_back(now, ClampToInt32(desired));
    while (delay_window_.front().first <= now - c.scale_down_delay_ms)
      delay_window_.pop_front();
    int32_t highest = 0;
    for (const auto& entry : delay_window_)
      highest = std::max(highest, entry.second);
    if (highest > desired) {
      reason += fmt::format("; held at {} by the {} s scale-down delay", highest,
                            static_cast<double>(c.scale_down_delay_ms) / kMsPerSecond);
      desired = highest;
    }
  }

  // The activator path: load seen in the stable window means at least one replica, at once.
  if (desired < 1 && load_.TrafficSince(now - c.stable_window_ms)) {
    desired = 1;
    reason += "; requests arrived, so at least 1 replica";
  }

  int32_t result = ClampToInt32(desired);
  if (result < c.min_replicas) {
    result = c.min_replicas;
    reason += fmt::format("; raised to min_replicas {}", c.min_replicas);
  } else if (result > c.max_replicas) {
    result = c.max_replicas;
    reason += fmt::format("; capped at max_replicas {}", c.max_replicas);
  }

  // Scale to zero only after the grace period with nothing wanted (the stable window already
  // shows no traffic for desired to be 0): the last replica is kept until then.
  if (result == 0) {
    if (!zero_wanted_since_ms_) zero_wanted_since_ms_ = now;
    if (ready_replicas > 0 && now - *zero_wanted_since_ms_ < c.scale_to_zero_grace_ms) {
      result = 1;
      reason = fmt::format(
          "no traffic in the last {} s; keeping 1 replica for the {} s scale-to-zero grace period",
          static_cast<double>(c.stable_window_ms) / kMsPerSecond,
          static_cast<double>(c.scale_to_zero_grace_ms) / kMsPerSecond);
    } else {
      reason = "no traffic for the stable window and the grace period: scaled to zero";
    }
  } else {
    zero_wanted_since_ms_.reset();
  }
  decision.desired = result;
  decision.reason = std::move(reason);

  load_.Forget(now - std::max({c.stable_window_ms, c.panic_window_ms}));
  return decision;
}

// ---- Target tracking ----

std::optional<std::string> ValidateTargetTrackingConfig(const TargetTrackingConfig& config) {
  if (!Finite(config.target) || config.target <= 0)
    return fmt::format("target must be above 0 (got {})", config.target);
  if (config.min_replicas < 0)
    return fmt::format("min_replicas must be 0 or more (got {})", config.min_replicas);
  if (config.max_replicas < 1)
    return fmt::format("max_replicas must be at least 1 (got {})", config.max_replicas);
  if (config.max_replicas < config.min_replicas)
    return fmt::format("max_replicas ({}) is below min_replicas ({})", config.max_replicas,
                       config.min_replicas);
  if (config.window_ms <= 0)
    return fmt::format("window_ms must be above 0 (got {})", config.window_ms);
  if (config.scale_in_cooldown_ms < 0)
    return fmt::format("scale_in_cooldown_ms must be 0 or more (got {})",
                       config.scale_in_cooldown_ms);
  return std::nullopt;
}

TargetTrackingAutoscaler::TargetTrackingAutoscaler(TargetTrackingConfig config) : config_(config) {
  if (auto why = ValidateTargetTrackingConfig(config_)) throw std::invalid_argument(*why);
}

void TargetTrackingAutoscaler::Record(const LoadSample& sample) {
  load_.Record(sample);
}

ScaleDecision TargetTrackingAutoscaler::Decide(TimeMs now, int32_t ready_replicas) {
  const TargetTrackingConfig& c = config_;
  ScaleDecision decision;
  decision.stable_value = load_.Average(c.metric, now, c.window_ms);
  decision.panic_value = decision.stable_value;
  int64_t wanted = CeilRatio(decision.stable_value, c.target);
  if (wanted < 1 && load_.TrafficSince(now - c.window_ms)) wanted = 1;
  const int32_t bounded =
      static_cast<int32_t>(std::clamp<int64_t>(wanted, c.min_replicas, c.max_replicas));
  std::string reason = fmt::format("the {} s {} of {:.2f} at {:.2f} per replica wants {} replicas",
                                   static_cast<double>(c.window_ms) / kMsPerSecond, Unit(c.metric),
                                   decision.stable_value, c.target, bounded);
  int32_t result = bounded;
  if (last_desired_ && bounded < *last_desired_ && now - last_change_ms_ < c.scale_in_cooldown_ms) {
    result = *last_desired_;
    reason += fmt::format("; scale-in waits for the {} s cooldown",
                          static_cast<double>(c.scale_in_cooldown_ms) / kMsPerSecond);
  }
  if (!last_desired_ || result != *last_desired_) last_change_ms_ = now;
  last_desired_ = result;
  (void)ready_replicas;  // the policy tracks its own desired capacity, as a cloud policy does
  decision.desired = result;
  decision.reason = std::move(reason);
  load_.Forget(now - c.window_ms);
  return decision;
}

}  // namespace gpufleet::serving
