#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/job.h"
#include "core/types.h"
#include "sched/queues.h"

namespace gpufleet::sched {

// "Which job next": the order in which pending jobs are considered.
enum class QueueOrder {
  kFifo,  // priority, then submit time
  kSjf,   // priority, then shortest runtime estimate (jobs without one go last)
  kLas,   // Tiresias 2D-LAS: discretised attained GPU-service queues, preemptive
  // Slurm-style weighted fair share: priority, then the job's queue's fair-share factor (highest
  // first, SchedulerConfig::fair_share_factor), then submit time.
  kFairShare,
};

// What to do when the job at the head of the order does not fit.
enum class Backfill {
  kNone,      // strict: nothing behind it starts (Slurm without backfill, Kueue StrictFIFO)
  kEasy,      // EASY: the head gets a reservation; later jobs start only if they do not delay it
  kFirstFit,  // skip it and try the next (Kueue BestEffortFIFO, Tiresias)
};

// "Where": how a job's tasks are placed on nodes and GPUs.
enum class PlacementPolicy {
  kBinPack,  // best fit: fill the fullest nodes and GPUs first, keep whole nodes free for gangs
  kSpread,   // worst fit: the emptiest nodes first
  // Fragmentation gradient descent (Weng et al., USENIX ATC'23): the node and GPU whose choice
  // least increases the fragmentation expected under SchedulerConfig::target_workload. Without a
  // target workload it places as kBinPack.
  kFgd,
};

// One task shape of the target workload FGD measures fragmentation against, with its popularity.
// The scheduler is pure, so the distribution is an input: the simulator builds it from the trace
// it replays (as the paper does), a server could build it from its recent jobs
// (TargetWorkloadOf).
struct TaskClass {
  MilliGpu gpu_milli_per_task = 0;  // a multiple of 1000 for whole GPUs, 1..999 for a share, or 0
  MilliCpu cpu_milli_per_task = 0;
  MiB memory_mib_per_task = 0;
  std::vector<std::string> gpu_models;  // any of these; empty means any model
  MiB min_gpu_memory_mib = 0;
  // Relative popularity, e.g. how many tasks of this shape were seen. Integral, so that the
  // fragmentation is an exact integer and equal choices compare equal.
  int64_t weight = 1;
  friend bool operator==(const TaskClass&, const TaskClass&) = default;
};

// How TargetWorkloadOf weighs a task shape.
enum class WorkloadWeight {
  kTasks,  // by its number of tasks: the paper's popularity (a random task)
  // By the GPUs its tasks ask for, a task of k whole GPUs counting k times and any other task once:
  // a rare 8-GPU task weighs as much as eight 1-GPU tasks, so FGD does not sacrifice the room it
  // needs for many small ones.
  kGpus,
};

// The target workload of these jobs: one class per distinct task shape, weighted by the number of
// tasks (a gang of k tasks counts k times) or their GPUs, in order of first appearance.
std::vector<TaskClass> TargetWorkloadOf(std::span<const JobSpec> jobs,
                                        WorkloadWeight weight = WorkloadWeight::kTasks);
std::optional<WorkloadWeight> ParseWorkloadWeight(std::string_view name);
const char* Name(WorkloadWeight weight);
std::vector<std::string> WorkloadWeightNames();

struct SchedulerConfig {
  QueueOrder order = QueueOrder::kFifo;
  Backfill backfill = Backfill::kNone;
  PlacementPolicy placement = PlacementPolicy::kBinPack;
  // Pending jobs may preempt running preemptible jobs that rank strictly lower in the order.
  bool preempt = false;
  // 2D-LAS queue limits in GPU-seconds of attained service; a job moves to queue k+1 once its
  // service passes limit k. Tiresias uses two queues; 3,200 GPU-s is close to its default.
  std::vector<int64_t> las_queue_limits_gpu_s = {3200};
  // Tiresias' starvation guard: a job that waited more than this many times its attained run time
  // goes back to the first queue. 0 disables it.
  double las_starvation_factor = 0.0;
  // Team queues with guaranteed GPU quotas (docs/quotas.md). Empty: no quota logic at all, and
  // jobs' queue names are ignored.
  std::vector<QueueConfig> queues;
  // Fair share (kFairShare): how fast past usage is forgotten; Slurm's PriorityDecayHalfLife
  // defaults to 7 days.
  int64_t fair_share_half_life_s = 7 * 24 * 3600;
  // Fair share: each queue's factor in (0, 1] as FairShareFactors (sched/fair_share.h) computes
  // it from decayed usage. The only part of the config that changes over time: the caller
  // refreshes it before each cycle. A queue not listed has used nothing (factor 1).
  // Hashed: looked up for every job a cycle ranks.
  std::unordered_map<std::string, double> fair_share_factor;
  // The task distribution kFgd placement measures fragmentation against; ignored by the other
  // placements.
  std::vector<TaskClass> target_workload;
};

std::optional<QueueOrder> ParseQueueOrder(std::string_view name);
std::optional<Backfill> ParseBackfill(std::string_view name);
std::optional<PlacementPolicy> ParsePlacementPolicy(std::string_view name);
const char* Name(QueueOrder order);
const char* Name(Backfill backfill);
const char* Name(PlacementPolicy placement);
// The names accepted by the parsers above, for help texts and error messages.
std::vector<std::string> QueueOrderNames();
std::vector<std::string> BackfillNames();
std::vector<std::string> PlacementPolicyNames();

// The backfill mode a queue order uses when none is asked for: strict FIFO stays strict, SJF and
// LAS skip jobs that do not fit (as in the Tiresias paper), fair share backfills behind a
// reservation (as Slurm's sched/backfill).
Backfill DefaultBackfill(QueueOrder order);

}  // namespace gpufleet::sched
