#pragma once

// The serving replay (`gpufleet sim --serving`, docs/autoscaling.md): request traces replayed
// against deployments of replicas, scaled by the same serving::KpaAutoscaler code the server's
// deployment controller runs, next to a target-tracking policy and a fixed fleet sized for the
// trace's peak.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/types.h"
#include "serving/autoscaler.h"
#include "sim/request_traces.h"

namespace gpufleet::sim {

enum class ServingPolicy {
  kKpa,             // serving::KpaAutoscaler
  kTargetTracking,  // serving::TargetTrackingAutoscaler
  kFixedAtPeak,     // replicas for the trace's peak, ready from the start, never scaled
};

std::string_view ServingPolicyName(ServingPolicy policy);
std::vector<ServingPolicy> AllServingPolicies();

struct ServingOptions {
  // The KPA's settings; target-tracking takes metric, min/max, the stable window as its window
  // and target x target_utilization as its target (the same per-replica load, so the two differ
  // only in how they react).
  serving::AutoscalerConfig autoscaler;
  TimeMs scale_in_cooldown_ms = 300000;  // target tracking: AWS's default
  // Replica model. A replica holds its GPUs from the moment it is started: pulling a cached
  // image, starting the server and loading a model's weights (a 7B model is ~14 GB: ~15 s at
  // 1 GB/s from local disk) make 30 s a typical cold start.
  TimeMs cold_start_ms = 30000;
  int32_t replica_concurrency = 1;  // requests a replica serves at once; the rest wait
  int32_t gpus_per_replica = 1;
  TimeMs tick_ms = 2000;  // the autoscaler's tick (Knative's tick-interval)
  TimeMs slo_ms = 60000;  // latency objective: requests above it are counted
  // Skip the ticks of a deployment with no replicas and nothing to do (recording the gap as one
  // idle sample, which the autoscalers average exactly like the ticks' samples). Same results;
  // off only to check that in tests.
  bool skip_idle = true;
  int64_t max_time_series_points = 2000;  // replicas over time, downsampled
};

// Why the options are invalid, or nothing.
std::optional<std::string> ValidateServingOptions(const ServingOptions& options);

// Replicas the fixed policy gives a deployment: its peak of requests in service at once when
// each starts on arrival, over the replica concurrency, at least 1.
int32_t PeakReplicas(const std::vector<Request>& requests, int32_t replica_concurrency);

struct LatencySummary {
  int64_t requests = 0;
  double mean_s = 0, p50_s = 0, p90_s = 0, p99_s = 0, max_s = 0;
  int64_t over_slo = 0;
};

struct DeploymentOutcome {
  std::string name;
  LatencySummary latency;
  double gpu_hours = 0;
  int64_t cold_starts = 0;     // replicas started after t0
  int32_t max_replicas = 0;    // most replicas held at once (starting, ready or draining)
  int32_t fixed_replicas = 0;  // what fixed-at-peak gives it
};

struct ReplicaPoint {
  TimeMs time = 0;      // since the first arrival
  double replicas = 0;  // all deployments; time-weighted average over the point's bucket
};

struct ServingPolicyResult {
  ServingPolicy policy = ServingPolicy::kKpa;
  LatencySummary latency;  // over all requests
  double gpu_hours = 0;
  int64_t cold_starts = 0;
  int32_t max_replicas = 0;    // most replicas held at once, all deployments together
  int32_t fixed_replicas = 0;  // fixed-at-peak: its total; others: 0
  TimeMs end_ms = 0;           // accounting ends here (last arrival or last completion)
  double wall_time_s = 0;      // filled in by the caller
  std::vector<DeploymentOutcome> deployments;  // in the trace's order
  std::vector<ReplicaPoint> replicas_over_time;
};

// Replays the trace under one policy. Deterministic: same input, same result. Throws
// std::invalid_argument on invalid options.
ServingPolicyResult SimulateServing(const RequestTrace& trace, ServingPolicy policy,
                                    const ServingOptions& options);

struct ServingReport {
  std::string trace;
  std::string format;
  int64_t requests = 0;
  int64_t deployments = 0;
  int64_t failed_replayed = 0;
  int64_t unfinished_skipped = 0;
  int64_t skipped_invalid = 0;
  TimeMs span_ms = 0;   // first to last arrival
  LlmServiceModel llm;  // Azure only
  ServingOptions options;
  std::vector<ServingPolicyResult> policies;
};

std::string FormatServingReport(const ServingReport& report);
nlohmann::json ToJson(const ServingReport& report);
// Replicas over time, one line per policy, in report.cpp's style.
std::string RenderServingSvg(const ServingReport& report, const std::string& title);

}  // namespace gpufleet::sim
