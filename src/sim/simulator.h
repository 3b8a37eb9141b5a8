#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/cluster.h"
#include "sched/policy.h"
#include "sched/types.h"
#include "sim/trace.h"

namespace gpufleet::sim {

// Where the scheduler's runtime estimates come from.
enum class Estimates {
  kNone,    // no oracle: jobs keep whatever estimate the trace gives (usually none)
  kOracle,  // the true duration, as SJF and EASY backfill studies assume
};

enum class SimMode {
  kReplay,  // event-driven replay of arrivals and completions
  kFill,    // FGD-style fragmentation experiment: place pods until a GPU pod no longer fits
};

std::optional<Estimates> ParseEstimates(std::string_view name);
std::optional<SimMode> ParseSimMode(std::string_view name);
const char* Name(Estimates estimates);
const char* Name(SimMode mode);
std::vector<std::string> EstimatesNames();
std::vector<std::string> SimModeNames();

// How fill mode makes its one-pod scheduling decisions (see Fill in simulator.cpp).
enum class FillEngine {
  kAllocator,  // one sched::Allocator kept across pods, as Schedule would place: O(pods)
  kSchedule,   // a sched::Schedule call per pod with every placed pod running: O(pods^2)
};

struct SimOptions {
  // Charged on every preemption: added to the job's remaining run time (checkpoint reload,
  // warm-up).
  TimeMs restart_cost_ms = 30 * kMsPerSecond;
  // A preempted job keeps its GPUs this long to checkpoint (SIGTERM, then the grace period) on
  // the cluster, so a job placed on GPUs a preemption freed starts this much later: charged by
  // adding it to that job's run time.
  TimeMs grace_period_ms = 0;
  Estimates estimates = Estimates::kNone;
  SimMode mode = SimMode::kReplay;
  // The recorded time series is downsampled to at most this many points (0 = keep all).
  int64_t max_time_series_points = 2000;
  FillEngine fill_engine = FillEngine::kAllocator;
  // Fill mode's stopping rule. 0: stop at the first pod asking for a GPU that cannot be placed.
  // Above 0, the FGD paper's measure: pods that do not fit are skipped and counted, and the run
  // stops once the arrived pods have asked for this many times the usable GPUs (1: 100 %).
  double fill_arrived = 0;
  // Fill mode: 0 keeps file order; otherwise each pass over the list is shuffled with this seed
  // (the paper shuffles the pod list; same seed, same order, on every platform).
  uint64_t fill_shuffle_seed = 0;
  // How the trace's task shapes are weighed into FGD's target workload when the config has none.
  // By GPUs: under the first-failure rule, weighing by tasks lets FGD give up the room of rare
  // multi-GPU pods (docs/benchmarks.md).
  sched::WorkloadWeight fgd_weight = sched::WorkloadWeight::kGpus;
  // Replay: keep the queue in the scheduler's order, let a cycle stop once nothing more can
  // start (sched::CycleOptions), and skip a cycle when nothing can start at all. Same decisions
  // either way (fewer scheduling cycles); off only to check that in tests.
  bool cycle_hints = true;
};

// The cluster's state after a change: pending jobs and allocated GPUs. Downsampled points carry
// time-weighted averages over their bucket, hence the doubles.
struct TimeSeriesPoint {
  TimeMs time = 0;
  double queue_length = 0;
  double allocated_gpus = 0;
};

// What happened to one job of the trace in a replay.
struct JobOutcome {
  TimeMs submit_time = 0;
  TimeMs first_start = -1;
  TimeMs finish = -1;
  int32_t preemptions = 0;
  int32_t queue = -1;  // index into SimResult::queue_names; -1 without queues
};

// The pod that ended a fill run.
struct FillStop {
  std::string trace_id;
  int64_t line = 0;
  int32_t tasks = 0;
  MilliGpu gpu_milli_per_task = 0;
  sched::WaitReason reason = sched::WaitReason::kInsufficientGpus;
};

struct FillResult {
  int64_t pods_placed = 0;      // all placed pods, GPU and CPU-only
  int64_t gpu_pods_placed = 0;  // pods that asked for a GPU or a share of one
  int64_t cpu_only_pods_failed = 0;
  int64_t passes = 0;  // times the pod list was started (1 = never wrapped around)
  MilliGpu allocated_gpu_milli = 0;
  int64_t usable_gpus = 0;
  // The first pod asking for a GPU that could not be placed: where the run stopped, unless
  // SimOptions::fill_arrived; empty when every GPU pod was placed.
  std::optional<FillStop> stop;
  double arrived_target = 0;      // SimOptions::fill_arrived of the run
  int64_t gpu_pods_failed = 0;    // GPU pods that could not be placed
  int64_t arrived_gpu_milli = 0;  // what the pods tried so far asked for, placed or not
  // FGD's fragmentation of the final state under the trace's task distribution weighed by tasks
  // (the paper's measure), whatever the placement and SimOptions::fgd_weight.
  double fragmented_gpu_milli = 0;
};

// Raw results; report.h turns them into the statistics people read.
struct SimResult {
  SimMode mode = SimMode::kReplay;
  int64_t usable_gpus = 0;
  int64_t jobs_total = 0;
  std::vector<JobOutcome> jobs;  // replay: one per trace job, in trace order
  TimeMs first_submit = 0;
  TimeMs last_finish = 0;
  // Integral of allocated GPUs over time, in milli-GPU x milliseconds, from the first submit to
  // the last finish. Kept in double: 512 GPUs x 4 months is ~5e18 milli-GPU-ms, near int64's limit.
  double allocated_gpu_milli_ms = 0;
  int64_t preemptions = 0;
  int64_t scheduling_cycles = 0;
  // With team queues (SchedulerConfig::queues), or under fair share the queues the trace's jobs
  // name: their names, and each one's integral of allocated GPUs over time (milli-GPU x ms), as
  // allocated_gpu_milli_ms.
  std::vector<std::string> queue_names;
  std::vector<double> queue_gpu_milli_ms;
  // The same integral per time bucket of queue_bucket_ms from the first submit:
  // queue_bucket_gpu_milli_ms[bucket][queue]. The width doubles as the run goes on, so that any
  // trace length gives between kMaxQueueBuckets / 2 and kMaxQueueBuckets buckets.
  static constexpr size_t kMaxQueueBuckets = 64;
  TimeMs queue_bucket_ms = 0;
  std::vector<std::vector<double>> queue_bucket_gpu_milli_ms;
  std::vector<TimeSeriesPoint> time_series;
  FillResult fill;  // fill mode only
};

// The simulation cannot go on: the scheduler returned inconsistent decisions or no progress is
// possible while jobs wait.
class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Removes the jobs that can never run on this cluster (sched::CheckFeasible). Without
// skip_infeasible the first one throws TraceError "file:line: ..." instead. Returns how many were
// removed; their messages are appended to trace.skip_examples (the first few).
int64_t RemoveInfeasibleJobs(const Cluster& cluster, Trace& trace, bool skip_infeasible);

// Offered load of the trace on `usable_gpus`: sum(GPUs x duration) / (usable GPUs x submit span).
// Zero when the span or the cluster is empty.
double OfferedLoad(const Trace& trace, int64_t usable_gpus);

// Multiplies every inter-arrival gap by `factor`, keeping the first submit time.
void ScaleSubmitTimes(Trace& trace, double factor);

// The target workload FGD placement measures fragmentation against: the trace's task shapes,
// weighted by how many tasks of each it has, or their GPUs (sched::TargetWorkloadOf).
std::vector<sched::TaskClass> TargetWorkloadOf(
    const Trace& trace, sched::WorkloadWeight weight = sched::WorkloadWeight::kTasks);

// Runs the trace to completion (replay) or until the cluster is full (fill). Under FGD placement
// with no target workload in `config`, the trace's own (TargetWorkloadOf, weighed by
// SimOptions::fgd_weight) is used. The trace must
// be sorted by submit time and every job must be feasible (RemoveInfeasibleJobs). Throws SimError.
SimResult Simulate(const Cluster& cluster, const Trace& trace, const sched::SchedulerConfig& config,
                   const SimOptions& options);

// Reduces a step series to at most max_points points of time-weighted averages over equal time
// buckets; the last point (the end state) is kept. Exposed for tests.
std::vector<TimeSeriesPoint> Downsample(const std::vector<TimeSeriesPoint>& series, TimeMs end,
                                        int64_t max_points);

}  // namespace gpufleet::sim
