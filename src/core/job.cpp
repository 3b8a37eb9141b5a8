#include "core/job.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpufleet {

std::optional<std::string> ValidateJobSpec(const JobSpec& spec) {
  if (spec.tasks < 1) return fmt::format("tasks must be at least 1, got {}", spec.tasks);
  if (spec.tasks_per_node < 0 || (spec.tasks_per_node > 0 && spec.tasks % spec.tasks_per_node))
    return fmt::format("{} tasks cannot be spread {} to a node", spec.tasks, spec.tasks_per_node);
  if (spec.gpu_milli_per_task < 0) return "GPUs per task must not be negative";
  if (spec.gpu_milli_per_task > kMilliPerGpu && spec.gpu_milli_per_task % kMilliPerGpu != 0)
    return fmt::format("{} milli-GPUs per task: above one GPU a task takes whole GPUs",
                       spec.gpu_milli_per_task);
  if (spec.cpu_milli_per_task < 0) return "CPU per task must not be negative";
  if (spec.memory_mib_per_task < 0) return "memory per task must not be negative";
  if (spec.min_gpu_memory_mib < 0) return "minimum GPU memory must not be negative";
  if (spec.runtime_estimate && *spec.runtime_estimate < 0) return "runtime estimate is negative";
  if (spec.gpu_milli_per_task == 0 && spec.cpu_milli_per_task == 0 && spec.memory_mib_per_task == 0)
    return "the job asks for no GPU, CPU or memory";
  return std::nullopt;
}

void SetGangShape(JobSpec& spec, int32_t gpus, int32_t gpus_per_node) {
  if (gpus <= 0) {
    spec.tasks = 1;
    spec.gpu_milli_per_task = 0;
    return;
  }
  int32_t per_task = std::min(gpus, std::max(1, gpus_per_node));
  while (gpus % per_task != 0)
    --per_task;
  spec.tasks = gpus / per_task;
  spec.gpu_milli_per_task = per_task * kMilliPerGpu;
}

}  // namespace gpufleet
