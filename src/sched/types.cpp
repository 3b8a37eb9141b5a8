#include "sched/types.h"

#include <fmt/format.h>

namespace gpufleet::sched {
namespace {

std::string DescribeAsk(const JobSpec& spec) {
  std::string gpus;
  if (spec.Fractional()) {
    gpus = fmt::format("{:.3g} of a GPU", spec.gpu_milli_per_task / 1000.0);
  } else {
    gpus =
        fmt::format("{} GPU{}", spec.WholeGpusPerTask(), spec.WholeGpusPerTask() == 1 ? "" : "s");
  }
  std::string text = spec.tasks == 1 ? gpus : fmt::format("{} tasks of {}", spec.tasks, gpus);
  if (!spec.gpu_models.empty()) text += fmt::format(" ({})", fmt::join(spec.gpu_models, " or "));
  if (spec.min_gpu_memory_mib > 0)
    text += fmt::format(" with at least {} MiB of GPU memory", spec.min_gpu_memory_mib);
  return text;
}

}  // namespace

bool IsInfeasible(WaitReason reason) {
  switch (reason) {
    case WaitReason::kInfeasibleGpuCount:
    case WaitReason::kInfeasibleTaskShape:
    case WaitReason::kInfeasibleGpuModel:
      return true;
    default:
      return false;
  }
}

const char* WaitReasonCode(WaitReason reason) {
  switch (reason) {
    case WaitReason::kInsufficientGpus:
      return "insufficient_gpus";
    case WaitReason::kInsufficientCpuOrMemory:
      return "insufficient_cpu_or_memory";
    case WaitReason::kBlockedByQueueHead:
      return "blocked_by_queue_head";
    case WaitReason::kReservedForEarlierJob:
      return "reserved_for_earlier_job";
    case WaitReason::kInfeasibleGpuCount:
      return "infeasible_gpu_count";
    case WaitReason::kInfeasibleTaskShape:
      return "infeasible_task_shape";
    case WaitReason::kInfeasibleGpuModel:
      return "infeasible_gpu_model";
  }
  return "unknown";
}

std::string DescribeWait(WaitReason reason, const JobSpec& spec) {
  const std::string ask = DescribeAsk(spec);
  switch (reason) {
    case WaitReason::kInsufficientGpus:
      return fmt::format("waiting for GPUs: {} are not free right now", ask);
    case WaitReason::kInsufficientCpuOrMemory:
      return fmt::format("waiting for CPU or memory on nodes with free GPUs for {}", ask);
    case WaitReason::kBlockedByQueueHead:
      return "waiting behind an earlier job in its queue (strict FIFO)";
    case WaitReason::kReservedForEarlierJob:
      return "free GPUs are reserved for an earlier job that starts first (backfill)";
    case WaitReason::kInfeasibleGpuCount:
      return fmt::format("can never run: the cluster cannot hold {} even when empty", ask);
    case WaitReason::kInfeasibleTaskShape:
      return fmt::format("can never run: no node has the GPUs, CPU and memory for one task of {}",
                         ask);
    case WaitReason::kInfeasibleGpuModel:
      return fmt::format("can never run: the cluster has no usable GPU matching {}", ask);
  }
  return "unknown";
}

}  // namespace gpufleet::sched
