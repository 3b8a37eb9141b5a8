#pragma once

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

enum class PreemptReason { kHigherPriority, kLasDemotion };

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
};

bool IsInfeasible(WaitReason reason);
const char* WaitReasonCode(WaitReason reason);  // stable snake_case code for APIs and JSON
std::string DescribeWait(WaitReason reason, const JobSpec& spec);  // a sentence for users

struct Waiting {
  JobId job = 0;
  WaitReason reason = WaitReason::kInsufficientGpus;
};

struct Decisions {
  std::vector<Placement> placements;    // start these, in this order
  std::vector<Preemption> preemptions;  // stop these first; their room is used by placements
  // Every pending job not placed, with the reason; empty when the caller asked for no
  // explanations (CycleOptions::explain_all_waiting false).
  std::vector<Waiting> waiting;
  // How many pending jobs the cycle went through, in queue order: all of them unless it stopped
  // early (CycleOptions::explain_all_waiting false).
  int64_t considered = 0;
};

}  // namespace gpufleet::sched
