#include "sim/serving_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "sim/report.h"

namespace gpufleet::sim {
namespace {

constexpr double kMsPerHour = 3600.0 * 1000.0;
constexpr TimeMs kNever = std::numeric_limits<TimeMs>::max();

double Seconds(TimeMs ms) {
  return static_cast<double>(ms) / kMsPerSecond;
}

LatencySummary Summarize(std::vector<double> latencies_s, TimeMs slo_ms) {
  LatencySummary summary;
  summary.requests = static_cast<int64_t>(latencies_s.size());
  if (latencies_s.empty()) return summary;
  std::sort(latencies_s.begin(), latencies_s.end());
  double sum = 0;
  for (double latency : latencies_s) {
    sum += latency;
    if (latency > Seconds(slo_ms)) ++summary.over_slo;
  }
  summary.mean_s = sum / static_cast<double>(latencies_s.size());
  summary.p50_s = Percentile(latencies_s, 50);
  summary.p90_s = Percentile(latencies_s, 90);
  summary.p99_s = Percentile(latencies_s, 99);
  summary.max_s = latencies_s.back();
  return summary;
}

struct Replica {
  TimeMs started_ms = 0;
  TimeMs ready_ms = 0;
  int32_t busy = 0;
  bool draining = false;  // removed by a scale-down while serving: takes nothing new
};

// A replica being created (+1) or removed (-1), for the replicas-over-time series.
struct ReplicaChange {
  TimeMs time = 0;
  int32_t delta = 0;
};

// One deployment's replay: its requests, its replicas and its autoscaler. Deployments share
// nothing (the cluster is assumed large enough), so each is replayed on its own.
class DeploymentReplay {
 public:
  DeploymentReplay(const std::vector<Request>& requests, ServingPolicy policy,
                   const ServingOptions& options, int32_t fixed_replicas, TimeMs horizon_ms)
      : requests_(requests), policy_(policy), options_(options), horizon_ms_(horizon_ms) {
    if (policy == ServingPolicy::kKpa) {
      autoscaler_.emplace<serving::KpaAutoscaler>(options.autoscaler);
    } else if (policy == ServingPolicy::kTargetTracking) {
      const serving::AutoscalerConfig& a = options.autoscaler;
      autoscaler_.emplace<serving::TargetTrackingAutoscaler>(
          serving::TargetTrackingConfig{.metric = a.metric,
                                        .target = a.target * a.target_utilization,
                                        .min_replicas = a.min_replicas,
                                        .max_replicas = a.max_replicas,
                                        .window_ms = a.stable_window_ms,
                                        .scale_in_cooldown_ms = options.scale_in_cooldown_ms});
    } else {
      for (int32_t i = 0; i < fixed_replicas; ++i)
        StartReplica(0, /*cold=*/false);
    }
  }

  void Run() {
    const bool scaled = policy_ != ServingPolicy::kFixedAtPeak;
    TimeMs next_tick = options_.tick_ms;
    while (true) {
      const TimeMs arrival =
          next_arrival_ < requests_.size() ? requests_[next_arrival_].arrival_ms : kNever;
      const TimeMs completion = completions_.empty() ? kNever : completions_.top().first;
      const TimeMs ready = starting_.empty() ? kNever : starting_.top().first;
      const bool work_left = arrival != kNever || completion != kNever || !queue_.empty();
      if (!work_left) {
        // Everything served: scaled policies keep ticking (scaling down costs time too) until
        // no replica is left or the trace's span is over; a fixed fleet runs to the end.
        if (!scaled || live_replicas_ == 0 || next_tick > horizon_ms_) break;
      }
      if (scaled && options_.skip_idle && live_replicas_ == 0 && queue_.empty() &&
          last_desired_ == 0 && arrival != kNever && next_tick < arrival) {
        // Nothing happens until the next arrival: one idle sample stands for the skipped ticks.
        const TimeMs last_skipped = (arrival - 1) / options_.tick_ms * options_.tick_ms;
        if (last_skipped >= next_tick) {
          AdvanceLoad(last_skipped);
          FlushSample(last_skipped);
          next_tick = last_skipped + options_.tick_ms;
          continue;
        }
      }
      const TimeMs tick = scaled ? next_tick : kNever;
      const TimeMs now = std::min({arrival, completion, ready, tick});
      if (now == kNever) break;
      AdvanceLoad(now);
      // At equal times: completions, then replicas becoming ready, then arrivals, then the tick
      // (which then sees the arrivals in its interval).
      if (completion == now) {
        Complete(now);
      } else if (ready == now) {
        BecomeReady(now);
      } else if (arrival == now) {
        Arrive(now);
      } else {
        Tick(now);
        next_tick = now + options_.tick_ms;
      }
    }
    end_ms_ = std::max(clock_ms_, horizon_ms_);
    for (size_t id = 0; id < replicas_.size(); ++id)
      if (alive_[id]) RemoveReplica(id, end_ms_);
  }

  DeploymentOutcome Outcome(std::string name, int32_t fixed_replicas) const {
    DeploymentOutcome outcome;
    outcome.name = std::move(name);
    outcome.latency = Summarize(latencies_s_, options_.slo_ms);
    outcome.gpu_hours = gpu_ms_ / kMsPerHour;
    outcome.cold_starts = cold_starts_;
    outcome.max_replicas = max_replicas_;
    outcome.fixed_replicas = fixed_replicas;
    return outcome;
  }

  const std::vector<double>& latencies_s() const { return latencies_s_; }
  const std::vector<ReplicaChange>& changes() const { return changes_; }
  double gpu_ms() const { return gpu_ms_; }
  int64_t cold_starts() const { return cold_starts_; }
  TimeMs end_ms() const { return end_ms_; }

 private:
  // The concurrency the gateway sees: requests in service plus those waiting for a slot.
  void AdvanceLoad(TimeMs now) {
    load_integral_ +=
        static_cast<double>(in_service_ + queue_.size()) * static_cast<double>(now - clock_ms_);
    clock_ms_ = now;
  }

  void FlushSample(TimeMs now) {
    const TimeMs interval = now - last_sample_ms_;
    serving::LoadSample sample{.time_ms = now,
                               .interval_ms = interval,
                               .concurrency = interval > 0 ? load_integral_ / interval : 0.0,
                               .arrivals = static_cast<double>(arrivals_since_sample_)};
    std::visit(
        [&](auto& a) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(a)>, std::monostate>)
            a.Record(sample);
        },
        autoscaler_);
    load_integral_ = 0;
    arrivals_since_sample_ = 0;
    last_sample_ms_ = now;
  }

  void Decide(TimeMs now) {
    int32_t desired = 0;
    std::visit(
        [&](auto& a) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(a)>, std::monostate>)
            desired = a.Decide(now, ready_replicas_).desired;
        },
        autoscaler_);
    last_desired_ = desired;
    Scale(now, desired);
  }

  void Tick(TimeMs now) {
    FlushSample(now);
    Decide(now);
  }

  void Arrive(TimeMs now) {
    queue_.push_back(next_arrival_++);
    ++arrivals_since_sample_;
    // The activator: a request for a deployment without replicas pokes the autoscaler at once
    // instead of waiting for the tick.
    if (policy_ != ServingPolicy::kFixedAtPeak && live_replicas_ == 0) {
      FlushSample(now);
      Decide(now);
    }
    Dispatch(now);
  }

  void Complete(TimeMs now) {
    const auto [time, id] = completions_.top();
    completions_.pop();
    --in_service_;
    --replicas_[id].busy;
    if (replicas_[id].draining && replicas_[id].busy == 0) RemoveReplica(id, now);
    Dispatch(now);
  }

  void BecomeReady(TimeMs now) {
    const size_t id = starting_.top().second;
    starting_.pop();
    if (alive_[id]) {
      ++ready_replicas_;
      ready_flag_[id] = true;
    }
    Dispatch(now);
  }

  // Waiting requests go to the least busy ready replica (ties: the oldest).
  void Dispatch(TimeMs now) {
    while (!queue_.empty()) {
      size_t best = replicas_.size();
      for (size_t id : serving_order_) {
        const Replica& r = replicas_[id];
        if (!ready_flag_[id] || r.draining || r.busy >= options_.replica_concurrency) continue;
        if (best == replicas_.size() || r.busy < replicas_[best].busy) best = id;
      }
      if (best == replicas_.size()) return;
      const Request& request = requests_[queue_.front()];
      queue_.pop_front();
      ++replicas_[best].busy;
      ++in_service_;
      const TimeMs done = now + request.service_ms;
      completions_.emplace(done, best);
      latencies_s_.push_back(Seconds(done - request.arrival_ms));
    }
  }

  void StartReplica(TimeMs now, bool cold) {
    const size_t id = replicas_.size();
    replicas_.push_back(
        Replica{.started_ms = now, .ready_ms = cold ? now + options_.cold_start_ms : now});
    alive_.push_back(true);
    ready_flag_.push_back(!cold);
    serving_order_.push_back(id);
    ++live_replicas_;
    if (cold) {
      ++cold_starts_;
      starting_.emplace(now + options_.cold_start_ms, id);
    } else {
      ++ready_replicas_;
    }
    changes_.push_back({now, +1});
    max_replicas_ = std::max(max_replicas_, live_replicas_);
  }

  void RemoveReplica(size_t id, TimeMs now) {
    // Scale-down drains busy replicas, and the replay ends only once nothing is in service.
    if (replicas_[id].busy > 0)
      throw std::logic_error("serving replay: a replica was removed while serving requests");
    alive_[id] = false;
    if (ready_flag_[id] && !replicas_[id].draining) --ready_replicas_;
    ready_flag_[id] = false;
    --live_replicas_;
    gpu_ms_ += static_cast<double>(now - replicas_[id].started_ms) * options_.gpus_per_replica;
    changes_.push_back({now, -1});
    std::erase(serving_order_, id);
  }

  void Scale(TimeMs now, int32_t desired) {
    int32_t current = 0;  // starting or ready, not draining
    for (size_t id : serving_order_)
      if (!replicas_[id].draining) ++current;
    for (; current < desired; ++current)
      StartReplica(now, /*cold=*/true);
    if (current <= desired) return;
    // Scale down: replicas still starting first, then idle ones, then busy ones drain; the
    // newest of each kind first.
    int32_t excess = current - desired;
    auto remove_where = [&](const std::function<bool(size_t)>& pick, bool drain) {
      std::vector<size_t> chosen;
      for (auto it = serving_order_.rbegin();
           it != serving_order_.rend() && static_cast<int32_t>(chosen.size()) < excess; ++it)
        if (!replicas_[*it].draining && pick(*it)) chosen.push_back(*it);
      for (size_t id : chosen) {
        --excess;
        if (drain) {
          replicas_[id].draining = true;
          --ready_replicas_;
        } else {
          RemoveReplica(id, now);
        }
      }
    };
    remove_where([&](size_t id) { return !ready_flag_[id]; }, false);
    remove_where([&](size_t id) { return ready_flag_[id] && replicas_[id].busy == 0; }, false);
    remove_where([&](size_t id) { return ready_flag_[id]; }, true);
  }

  const std::vector<Request>& requests_;
  const ServingPolicy policy_;
  const ServingOptions& options_;
  const TimeMs horizon_ms_;
  std::variant<std::monostate, serving::KpaAutoscaler, serving::TargetTrackingAutoscaler>
      autoscaler_;

  size_t next_arrival_ = 0;
  std::deque<size_t> queue_;  // waiting at the gateway, by index into requests_
  int64_t in_service_ = 0;
  std::vector<Replica> replicas_;  // every replica ever started, by id
  std::vector<bool> alive_, ready_flag_;
  std::vector<size_t> serving_order_;  // live replicas, oldest first
  int32_t live_replicas_ = 0;          // starting, ready or draining: holding GPUs
  int32_t ready_replicas_ = 0;         // ready and not draining
  using TimedId = std::pair<TimeMs, size_t>;
  std::priority_queue<TimedId, std::vector<TimedId>, std::greater<>> completions_, starting_;

  TimeMs clock_ms_ = 0;
  double load_integral_ = 0;  // (in service + waiting) x ms since the last sample
  int64_t arrivals_since_sample_ = 0;
  TimeMs last_sample_ms_ = 0;
  int32_t last_desired_ = 0;

  std::vector<double> latencies_s_;
  std::vector<ReplicaChange> changes_;
  double gpu_ms_ = 0;
  int64_t cold_starts_ = 0;
  int32_t max_replicas_ = 0;
  TimeMs end_ms_ = 0;
};

// The step function of total replicas, downsampled into at most `max_points` buckets holding
// time-weighted averages.
std::vector<ReplicaPoint> ReplicaSeries(std::vector<ReplicaChange> changes, TimeMs end_ms,
                                        int64_t max_points, int32_t& max_total) {
  std::stable_sort(changes.begin(), changes.end(),
                   [](const ReplicaChange& a, const ReplicaChange& b) { return a.time < b.time; });
  std::vector<ReplicaPoint> steps;  // value from this time on
  int64_t total = 0;
  max_total = 0;
  for (size_t i = 0; i < changes.size();) {
    const TimeMs time = changes[i].time;
    for (; i < changes.size() && changes[i].time == time; ++i)
      total += changes[i].delta;
    max_total = std::max(max_total, static_cast<int32_t>(total));
    steps.push_back({time, static_cast<double>(total)});
  }
  if (steps.empty() || end_ms <= 0) return steps;
  if (max_points <= 0 || static_cast<int64_t>(steps.size()) <= max_points) {
    steps.push_back({end_ms, steps.back().replicas});
    return steps;
  }
  const double bucket = static_cast<double>(end_ms) / static_cast<double>(max_points);
  std::vector<ReplicaPoint> points;
  size_t next = 0;
  double value = 0;
  for (int64_t b = 0; b < max_points; ++b) {
    const auto from = static_cast<TimeMs>(std::llround(bucket * static_cast<double>(b)));
    const auto to = static_cast<TimeMs>(std::llround(bucket * static_cast<double>(b + 1)));
    double area = 0;
    TimeMs at = from;
    while (next < steps.size() && steps[next].time <= at)
      value = steps[next++].replicas;
    while (next < steps.size() && steps[next].time < to) {
      area += value * static_cast<double>(steps[next].time - at);
      at = steps[next].time;
      value = steps[next++].replicas;
    }
    area += value * static_cast<double>(to - at);
    points.push_back({from, to > from ? area / static_cast<double>(to - from) : value});
  }
  points.push_back({end_ms, value});
  return points;
}

}  // namespace

std::string_view ServingPolicyName(ServingPolicy policy) {
  switch (policy) {
    case ServingPolicy::kKpa:
      return "kpa";
    case ServingPolicy::kTargetTracking:
      return "target-tracking";
    case ServingPolicy::kFixedAtPeak:
      return "fixed-at-peak";
  }
  return "unknown";
}

std::vector<ServingPolicy> AllServingPolicies() {
  return {ServingPolicy::kKpa, ServingPolicy::kTargetTracking, ServingPolicy::kFixedAtPeak};
}

std::optional<std::string> ValidateServingOptions(const ServingOptions& options) {
  if (auto why = serving::ValidateAutoscalerConfig(options.autoscaler)) return why;
  if (options.scale_in_cooldown_ms < 0) return "the scale-in cooldown must be 0 or more";
  if (options.cold_start_ms < 0) return "the cold start must be 0 or more";
  if (options.replica_concurrency < 1) return "a replica must serve at least 1 request at once";
  if (options.gpus_per_replica < 1) return "a replica needs at least 1 GPU";
  if (options.tick_ms < 1) return "the autoscaler tick must be at least 1 ms";
  if (options.slo_ms < 0) return "the SLO must be 0 or more";
  return std::nullopt;
}

int32_t PeakReplicas(const std::vector<Request>& requests, int32_t replica_concurrency) {
  std::vector<std::pair<TimeMs, int32_t>> events;
  events.reserve(requests.size() * 2);
  for (const Request& request : requests) {
    events.emplace_back(request.arrival_ms, +1);
    events.emplace_back(request.arrival_ms + request.service_ms, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times, ends (-1) before starts
  int64_t in_flight = 0, peak = 0;
  for (const auto& [time, delta] : events) {
    in_flight += delta;
    peak = std::max(peak, in_flight);
  }
  const int64_t replicas = (peak + replica_concurrency - 1) / std::max(1, replica_concurrency);
  return static_cast<int32_t>(std::clamp<int64_t>(replicas, 1, 1'000'000));
}

ServingPolicyResult SimulateServing(const RequestTrace& trace, ServingPolicy policy,
                                    const ServingOptions& options) {
  if (auto why = ValidateServingOptions(options)) throw std::invalid_argument(*why);
  std::vector<std::vector<Request>> by_deployment(trace.deployments.size());
  for (const Request& request : trace.requests) {
    if (request.deployment < 0 ||
        static_cast<size_t>(request.deployment) >= trace.deployments.size())
      throw std::invalid_argument("a request names a deployment the trace does not have");
    by_deployment[static_cast<size_t>(request.deployment)].push_back(request);
  }
  const TimeMs horizon = trace.requests.empty() ? 0 : trace.requests.back().arrival_ms;

  ServingPolicyResult result;
  result.policy = policy;
  std::vector<double> latencies;
  std::vector<ReplicaChange> changes;
  double gpu_ms = 0;
  for (size_t d = 0; d < by_deployment.size(); ++d) {
    const int32_t fixed = PeakReplicas(by_deployment[d], options.replica_concurrency);
    DeploymentReplay replay(by_deployment[d], policy, options, fixed, horizon);
    replay.Run();
    result.deployments.push_back(replay.Outcome(trace.deployments[d], fixed));
    latencies.insert(latencies.end(), replay.latencies_s().begin(), replay.latencies_s().end());
    changes.insert(changes.end(), replay.changes().begin(), replay.changes().end());
    gpu_ms += replay.gpu_ms();
    result.cold_starts += replay.cold_starts();
    result.end_ms = std::max(result.end_ms, replay.end_ms());
    if (policy == ServingPolicy::kFixedAtPeak) result.fixed_replicas += fixed;
  }
  result.latency = Summarize(std::move(latencies), options.slo_ms);
  result.gpu_hours = gpu_ms / kMsPerHour;
  result.replicas_over_time = ReplicaSeries(std::move(changes), result.end_ms,
                                            options.max_time_series_points, result.max_replicas);
  return result;
}

// ---- Report ----

namespace {

std::string Days(TimeMs ms) {
  const double hours = static_cast<double>(ms) / kMsPerHour;
  return hours >= 48 ? fmt::format("{:.1f} days", hours / 24) : fmt::format("{:.2f} h", hours);
}

nlohmann::json LatencyJson(const LatencySummary& l) {
  return {{"requests", l.requests}, {"mean_s", l.mean_s}, {"p50_s", l.p50_s},
          {"p90_s", l.p90_s},       {"p99_s", l.p99_s},   {"max_s", l.max_s},
          {"over_slo", l.over_slo}};
}

}  // namespace

std::string FormatServingReport(const ServingReport& r) {
  const ServingOptions& o = r.options;
  const serving::AutoscalerConfig& a = o.autoscaler;
  std::string out = fmt::format("serving replay: {} ({})\n", r.trace, r.format);
  out += fmt::format("  requests       {} over {}, {} deployment{}\n", GroupThousands(r.requests),
                     Days(r.span_ms), r.deployments, r.deployments == 1 ? "" : "s");
  if (r.failed_replayed > 0 || r.unfinished_skipped > 0)
    out += fmt::format(
        "  trace rows     {} failed requests replayed (they ran for their exec time), {} still "
        "pending or processing skipped\n",
        GroupThousands(r.failed_replayed), GroupThousands(r.unfinished_skipped));
  if (r.skipped_invalid > 0)
    out += fmt::format("  skipped        {} malformed rows\n", GroupThousands(r.skipped_invalid));
  if (r.format == "azure")
    out += fmt::format(
        "  service time   {:g} ms per 1k context tokens + {:g} ms per generated token\n",
        r.llm.prefill_ms_per_1k_tokens, r.llm.decode_ms_per_token);
  out += fmt::format(
      "  replicas       cold start {:g} s, {} request{} at once, {} GPU{} each; tick {:g} s\n",
      Seconds(o.cold_start_ms), o.replica_concurrency, o.replica_concurrency == 1 ? "" : "s",
      o.gpus_per_replica, o.gpus_per_replica == 1 ? "" : "s", Seconds(o.tick_ms));
  out += fmt::format(
      "  autoscaling    {} target {:g} x {:g} per replica, replicas {}..{}, stable {:g} s, panic "
      "{:g} s (x{:g}), scale-to-zero grace {:g} s; target-tracking scale-in cooldown {:g} s\n",
      serving::ScaleMetricName(a.metric), a.target, a.target_utilization, a.min_replicas,
      a.max_replicas, Seconds(a.stable_window_ms), Seconds(a.panic_window_ms), a.panic_threshold,
      Seconds(a.scale_to_zero_grace_ms), Seconds(o.scale_in_cooldown_ms));
  out += fmt::format("\n{:<24} {:>10} {:>8} {:>8} {:>8} {:>13} {:>11} {:>12} {:>8}\n", "policy",
                     "GPU-hours", "p50 s", "p90 s", "p99 s",
                     fmt::format("> SLO {:g} s", Seconds(o.slo_ms)), "cold starts", "max replicas",
                     "wall s");
  for (const ServingPolicyResult& p : r.policies) {
    const std::string name =
        p.policy == ServingPolicy::kFixedAtPeak
            ? fmt::format("{} ({})", ServingPolicyName(p.policy), p.fixed_replicas)
            : std::string(ServingPolicyName(p.policy));
    out +=
        fmt::format("{:<24} {:>10.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>13} {:>11} {:>12} {:>8.2f}\n",
                    name, p.gpu_hours, p.latency.p50_s, p.latency.p90_s, p.latency.p99_s,
                    GroupThousands(p.latency.over_slo), GroupThousands(p.cold_starts),
                    p.max_replicas, p.wall_time_s);
  }
  return out;
}

nlohmann::json ToJson(const ServingReport& r) {
  const ServingOptions& o = r.options;
  const serving::AutoscalerConfig& a = o.autoscaler;
  nlohmann::json out;
  out["trace"] = r.trace;
  out["format"] = r.format;
  out["requests"] = r.requests;
  out["deployments"] = r.deployments;
  out["failed_replayed"] = r.failed_replayed;
  out["unfinished_skipped"] = r.unfinished_skipped;
  out["skipped_invalid"] = r.skipped_invalid;
  out["span_s"] = Seconds(r.span_ms);
  if (r.format == "azure")
    out["service_model"] = {{"prefill_ms_per_1k_tokens", r.llm.prefill_ms_per_1k_tokens},
                            {"decode_ms_per_token", r.llm.decode_ms_per_token}};
  out["replica"] = {{"cold_start_s", Seconds(o.cold_start_ms)},
                    {"concurrency", o.replica_concurrency},
                    {"gpus", o.gpus_per_replica}};
  out["autoscaler"] = {{"metric", serving::ScaleMetricName(a.metric)},
                       {"target", a.target},
                       {"target_utilization", a.target_utilization},
                       {"min_replicas", a.min_replicas},
                       {"max_replicas", a.max_replicas},
                       {"stable_window_s", Seconds(a.stable_window_ms)},
                       {"panic_window_s", Seconds(a.panic_window_ms)},
                       {"panic_threshold", a.panic_threshold},
                       {"max_scale_up_rate", a.max_scale_up_rate},
                       {"max_scale_down_rate", a.max_scale_down_rate},
                       {"scale_to_zero_grace_s", Seconds(a.scale_to_zero_grace_ms)},
                       {"scale_down_delay_s", Seconds(a.scale_down_delay_ms)},
                       {"tick_s", Seconds(o.tick_ms)},
                       {"scale_in_cooldown_s", Seconds(o.scale_in_cooldown_ms)}};
  out["slo_s"] = Seconds(o.slo_ms);
  nlohmann::json policies = nlohmann::json::array();
  for (const ServingPolicyResult& p : r.policies) {
    nlohmann::json deployments = nlohmann::json::array();
    for (const DeploymentOutcome& d : p.deployments)
      deployments.push_back({{"name", d.name},
                             {"latency", LatencyJson(d.latency)},
                             {"gpu_hours", d.gpu_hours},
                             {"cold_starts", d.cold_starts},
                             {"max_replicas", d.max_replicas},
                             {"peak_replicas", d.fixed_replicas}});
    nlohmann::json series = nlohmann::json::array();
    for (const ReplicaPoint& point : p.replicas_over_time)
      series.push_back({Seconds(point.time), point.replicas});
    policies.push_back({{"policy", ServingPolicyName(p.policy)},
                        {"gpu_hours", p.gpu_hours},
                        {"latency", LatencyJson(p.latency)},
                        {"cold_starts", p.cold_starts},
                        {"max_replicas", p.max_replicas},
                        {"fixed_replicas", p.fixed_replicas},
                        {"end_s", Seconds(p.end_ms)},
                        {"wall_time_s", p.wall_time_s},
                        {"deployments", deployments},
                        {"replicas_over_time", series}});
  }
  out["policies"] = policies;
  return out;
}

std::string RenderServingSvg(const ServingReport& report, const std::string& title) {
  constexpr double kWidth = 1000, kLeft = 80, kRight = 30, kPlotWidth = kWidth - kLeft - kRight;
  const double legend_height = 18 * static_cast<double>(report.policies.size());
  const double top = 56 + legend_height, plot_height = 360;
  const double height = top + plot_height + 60;
  double end_hours = 0, max_replicas = 0;
  for (const ServingPolicyResult& p : report.policies)
    for (const ReplicaPoint& point : p.replicas_over_time) {
      end_hours = std::max(end_hours, static_cast<double>(point.time) / kMsPerHour);
      max_replicas = std::max(max_replicas, point.replicas);
    }
  const double x_step = NiceStep(end_hours, 10);
  const double x_max = std::max(x_step, std::ceil(end_hours / x_step) * x_step);
  const double y_step = NiceStep(max_replicas, 5);
  const double y_max = std::max(y_step, std::ceil(max_replicas * 1.05 / y_step) * y_step);
  auto x_of = [&](double hours) { return kLeft + hours / x_max * kPlotWidth; };
  auto y_of = [&](double value) { return top + plot_height - value / y_max * plot_height; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" "
      "font-weight=\"bold\">{3}</text>\n",
      kWidth, height, kWidth / 2, XmlEscape(title));
  const double bottom = top + plot_height;
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
      top, kPlotWidth, plot_height);
  for (double v = 0; v <= y_max + y_step / 2; v += y_step)
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, y_of(v), kLeft + kPlotWidth, kLeft - 6, y_of(v) + 4, TickLabel(v));
  for (double h = 0; h <= x_max + x_step / 2; h += x_step)
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x_of(h), bottom, bottom + 5, bottom + 18, TickLabel(h));
  svg += fmt::format(
      "<text x=\"20\" y=\"{0:.1f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 20 {0:.1f})\">replicas (all deployments)</text>\n"
      "<text x=\"{1}\" y=\"{2}\" text-anchor=\"middle\">time (hours)</text>\n",
      top + plot_height / 2, kLeft + kPlotWidth / 2, bottom + 34);
  const size_t count = report.policies.size();
  for (size_t i = 0; i < count; ++i) {
    const ServingPolicyResult& p = report.policies[i];
    std::string points;
    double previous_y = 0;
    for (size_t k = 0; k < p.replicas_over_time.size(); ++k) {
      const ReplicaPoint& point = p.replicas_over_time[k];
      const double x = x_of(static_cast<double>(point.time) / kMsPerHour);
      const double y = y_of(point.replicas);
      if (k > 0) points += fmt::format("{:.1f},{:.1f} ", x, previous_y);
      points += fmt::format("{:.1f},{:.1f} ", x, y);
      previous_y = y;
    }
    if (!points.empty()) points.pop_back();
    // Earlier policies draw wider, so that identical curves stay visible under later ones.
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{:.1f}\" points=\"{}\"/>\n",
        SvgColor(i), 1.2 + 1.2 * static_cast<double>(count - 1 - i), points);
    const double y = 54 + 18 * static_cast<double>(i), x = kLeft + 12;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/>\n<text x=\"{4}\" y=\"{5:.1f}\">{6}</text>\n",
        x, y - 4, x + 20, SvgColor(i), x + 26, y,
        XmlEscape(fmt::format("{}: {:.1f} GPU-hours, p99 {:.1f} s, {} over the SLO",
                              ServingPolicyName(p.policy), p.gpu_hours, p.latency.p99_s,
                              GroupThousands(p.latency.over_slo))));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace gpufleet::sim
