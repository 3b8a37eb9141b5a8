#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/job.h"

namespace gpufleet::sched {

// One GPU (or a share of it) held by a task. `gpu` is the GPU's position on its node.
struct GpuShare {
  int32_t gpu = 0;
  MilliGpu milli = kMilliPerGpu;
  friend bool operator==(const GpuShare&, const GpuShare&) = default;
};

// Where one task of a gang runs: a node (its position in Cluster::nodes) and GPUs on it. CPU and
// memory are the task's request from its JobSpec.
struct TaskPlacement {
  int32_t node = 0;
  std::vector<GpuShare> gpus;
  friend bool operator==(const TaskPlacement&, const TaskPlacement&) = default;
};

using Allocation = std::vector<TaskPlacement>;  // one entry per task, in rank order

struct RunningJob {
  JobSpec spec;
  Allocation allocation;
  TimeMs start_time = 0;  // start of the current run (after the last preemption, if any)
  // GPU-milliseconds of service received so far over all runs (GPUs x time), for LAS policies.
  int64_t attained_gpu_ms = 0;
};

struct PendingJob {
  JobSpec spec;
  int64_t attained_gpu_ms = 0;  // service from earlier runs, kept across preemption
  TimeMs last_run_end = -1;     // when it last stopped running; -1 if it never ran
  int32_t preemptions = 0;
};

struct Placement {
  JobId job = 0;
  Allocation allocation;
};

enum class PreemptReason {
  kHigherPriority,  // a job of higher priority (of the same queue, when queues are configured)
  kLasDemotion,     // 2D-LAS: a job of an earlier attained-service queue at the same priority
  kReclaim,         // a queue below its guarantee takes back quota another queue borrowed
};
const char* PreemptReasonCode(PreemptReason reason);   // stable snake_case code
std::string DescribePreemption(PreemptReason reason);  // a sentence for users

struct Preemption {
  JobId job = 0;
  JobId for_job = 0;  // the pending job that needed the room
  PreemptReason reason = PreemptReason::kHigherPriority;
};

// Why a job is still pending after a cycle. Infeasible reasons mean the job can never fit this
// cluster as it is (even empty); the others mean it does not fit now.
enum class WaitReason {
  kInsufficientGpus,         // not enough free GPUs of the asked kind right now
  kInsufficientCpuOrMemory,  // GPUs free, but not on nodes with the CPU/memory the tasks need
  kBlockedByQueueHead,       // strict FIFO: an earlier job is waiting
  kReservedForEarlierJob,    // EASY backfill: would delay the reservation of an earlier job
  kInfeasibleGpuCount,       // more GPUs than the whole usable cluster has
  kInfeasibleTaskShape,      // no node can ever host one task (GPUs, CPU or memory per task)
  kInfeasibleGpuModel,       // no usable GPU of the asked model / memory exists
  kInfeasibleNodeCount,      // fewer nodes than its tasks / tasks_per_node can each host a group
  // Team queues (SchedulerConfig::queues):
  kOverQuota,        // its queue would go above its guarantee plus what it may borrow
  kCohortExhausted,  // it may borrow, but the cohort has no unused guarantee left for it
  kUnknownQueue,     // names a queue that is not configured
  kInfeasibleQuota,  // asks more than its queue could ever hold, even borrowing all it may
};

bool IsInfeasible(WaitReason reason);
const char* WaitReasonCode(WaitReason reason);  // stable snake_case code for APIs and JSON
std::string DescribeWait(WaitReason reason, const JobSpec& spec);  // a sentence for users

// The numbers behind a quota wait, so that the user sentence can name them.
struct QuotaWait {
  std::string queue;
  std::string cohort;      // empty when the queue has none
  std::string model;       // the GPU model of a per-model guarantee; empty: all models
  int64_t used_milli = 0;  // what the queue's running jobs hold
  int64_t ask_milli = 0;   // what the job asks
  int64_t guaranteed_milli = 0;
  int64_t borrowing_limit_milli = -1;  // -1: no limit but the cohort's
  int64_t cohort_unused_milli = -1;    // unused guarantee left in the cohort; -1 without cohort
  friend bool operator==(const QuotaWait&, const QuotaWait&) = default;
};

struct Waiting {
  JobId job = 0;
  WaitReason reason = WaitReason::kInsufficientGpus;
  std::optional<QuotaWait> quota;  // for the quota reasons, with explanations
};

// The sentence for a waiting job, with the queue's numbers where the cycle gave them.
std::string DescribeWait(const Waiting& waiting, const JobSpec& spec);

struct Decisions {
  std::vector<Placement> placements;    // start these, in this order
  std::vector<Preemption> preemptions;  // stop these first; their room is used by placements
  // Every pending job not placed, with the reason; empty when the caller asked for no
  // explanations (CycleOptions::explain_all_waiting false).
  std::vector<Waiting> waiting;
  // How many pending jobs the cycle went through, in queue order: all of them unless it stopped
  // early (CycleOptions::explain_all_waiting false).
  int64_t considered = 0;
  // Strict FIFO with team queues: the job at the head of each queue that waits, so that no job of
  // its queue behind it may start (in the order the cycle found them).
  std::vector<JobId> blocked_heads;
};

}  // namespace gpufleet::sched
