#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/simulator.h"

namespace gpufleet::sim {

// What was simulated, as the top of a report shows it. Filled in by the caller (the CLI), which
// knows the file names and flags.
struct RunDescription {
  std::string trace;         // source path(s)
  std::string trace_format;  // "philly", "itp", ...
  std::string cluster;       // e.g. "64 nodes x 8 GPUs (uniform, H100-80GB)"
  int64_t nodes = 0;
  std::string policy;  // queue order
  std::string backfill;
  std::string placement;
  bool preempt = false;
  std::string queues_file;  // --queues, empty without
  std::string queue_by;     // how trace jobs were assigned to queues
  std::string estimates;
  std::vector<int64_t> las_queue_limits_gpu_s;
  double restart_cost_s = 0;
  double grace_period_s = 0;
  int64_t fair_share_half_life_s = 0;  // fairshare only
  // Load scaling (--load): the offered load as recorded, the one asked for, and the factor the
  // inter-arrival times were multiplied by. Empty when the trace's own arrival times were used.
  std::optional<double> offered_load;
  std::optional<double> target_load;
  double arrival_scale = 1.0;
  int64_t skipped_invalid = 0;     // rows the trace reader skipped
  int64_t skipped_infeasible = 0;  // jobs that can never fit this cluster
};

// One team queue's share of a replay (--queues).
struct QueueReport {
  std::string name;
  int64_t jobs = 0;
  int64_t completed = 0;
  double jct_mean_s = 0;
  double queueing_mean_s = 0;
  int64_t preemptions = 0;  // of this queue's jobs
  double gpu_share = 0;     // of all allocated GPU-time, 0..1
};

// Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one has all.
// 0 for an empty or all-zero list.
double JainIndex(std::span<const double> values);

struct SimReport {
  RunDescription run;
  SimMode mode = SimMode::kReplay;
  int64_t usable_gpus = 0;
  int64_t jobs_total = 0;  // jobs (pods) simulated, after skipping
  int64_t jobs_completed = 0;
  int64_t jobs_skipped = 0;  // invalid plus infeasible

  // Replay statistics, in seconds. JCT = finish - submit; queueing delay = first start - submit.
  double jct_mean_s = 0;
  double jct_median_s = 0;
  double jct_p95_s = 0;
  double jct_p99_s = 0;
  double queueing_mean_s = 0;
  double queueing_p99_s = 0;
  double makespan_s = 0;           // last finish - first submit
  double mean_gpu_allocation = 0;  // time-weighted allocated / usable GPUs over the makespan, 0..1
  int64_t preemptions = 0;
  int64_t scheduling_cycles = 0;
  double wall_time_s = 0;  // measured by the caller around Simulate
  // Team queues, in configuration order, and Jain's index over their GPU shares; empty without.
  std::vector<QueueReport> queues;
  double queue_fairness = 0;
  // Each queue's GPUs over time: per window of queue_window_s from the first submit, the average
  // GPUs each queue held (queue_gpus[window][queue], queues as above).
  double queue_window_s = 0;
  std::vector<std::vector<double>> queue_gpus;

  // Fill mode.
  FillResult fill;
  double allocated_gpus = 0;
  double unallocated_gpus = 0;
  double unallocated_fraction = 0;  // of the usable GPUs, 0..1

  std::vector<TimeSeriesPoint> time_series;  // times relative to the first submit
};

// Percentile with linear interpolation between closest ranks (numpy's default), p in [0, 100].
// `sorted` must be sorted ascending; 0 when it is empty.
double Percentile(const std::vector<double>& sorted, double p);

SimReport MakeReport(const SimResult& result, RunDescription run);

// "45.0 s", "12.5 min", "3.20 h".
std::string FormatDuration(double seconds);
// 1234567 -> "1,234,567".
std::string GroupThousands(int64_t value);

// SVG helpers shared by the plots (this file's RenderSvg, serving_report.cpp).
std::string XmlEscape(std::string_view text);
// A round step (1, 2 or 5 times a power of ten) giving about `target` intervals over [0, max].
double NiceStep(double max, int target);
std::string TickLabel(double value);
const char* SvgColor(size_t index);  // the plots' palette, cycling

// The human table for one run.
std::string FormatReport(const SimReport& report);
// One row per run, for judging policies side by side on the same input.
std::string FormatComparison(std::span<const SimReport> reports);

// Stable field names; durations in seconds as numbers.
nlohmann::json ToJson(const SimReport& report);

// Two stacked panels over time in hours: allocated GPUs against capacity, and queue length.
// One line per report (several for a comparison).
std::string RenderSvg(std::span<const SimReport> reports, const std::string& title);

}  // namespace gpufleet::sim
