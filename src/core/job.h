#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/types.h"

namespace gpufleet {

// What a user asks for. A job is a gang of `tasks` identical tasks; each task runs on one node
// and all tasks start together or not at all.
struct JobSpec {
  JobId id = 0;
  std::string name;
  std::string queue = "default";
  int32_t priority = 0;  // higher runs first

  int32_t tasks = 1;
  // 0: tasks go wherever they fit, several on one node where they fit (the fewest nodes first).
  // k > 0: exactly k tasks on each node the job uses, so it spans tasks / k distinct nodes
  // (Slurm's --nodes with --ntasks-per-node, torchrun's --nnodes and --nproc-per-node).
  int32_t tasks_per_node = 0;
  // Per task: a multiple of 1000 for whole GPUs, or 1..999 for a share of one GPU.
  MilliGpu gpu_milli_per_task = kMilliPerGpu;
  MilliCpu cpu_milli_per_task = 0;
  MiB memory_mib_per_task = 0;

  std::vector<std::string> gpu_models;  // any of these; empty means any model
  MiB min_gpu_memory_mib = 0;

  TimeMs submit_time = 0;
  std::optional<TimeMs> runtime_estimate;  // user's or oracle's estimate of the run time
  bool preemptible = true;

  bool Fractional() const { return gpu_milli_per_task > 0 && gpu_milli_per_task < kMilliPerGpu; }
  // Whole GPUs per task; 0 for fractional and CPU-only tasks.
  int32_t WholeGpusPerTask() const { return Fractional() ? 0 : gpu_milli_per_task / kMilliPerGpu; }
  MilliGpu TotalGpuMilli() const { return gpu_milli_per_task * tasks; }
  // The distinct nodes it needs; 0 when its tasks may share nodes freely.
  int32_t Nodes() const { return tasks_per_node > 0 ? tasks / tasks_per_node : 0; }
};

// Returns why the spec is malformed (zero tasks, 1.5 GPUs per task, negative CPU), or nothing.
std::optional<std::string> ValidateJobSpec(const JobSpec& spec);

// Splits a job asking for `gpus` GPUs in total into a gang of equal tasks that each fit on a node
// with `gpus_per_node` GPUs: the task size is the largest divisor of `gpus` not above
// `gpus_per_node`, so 16 GPUs on 8-GPU nodes become 2 tasks of 8 and 12 become 2 tasks of 6.
// Traces that only record a GPU count use this.
void SetGangShape(JobSpec& spec, int32_t gpus, int32_t gpus_per_node);

}  // namespace gpufleet
