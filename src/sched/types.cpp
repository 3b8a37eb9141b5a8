#include "sched/types.h"

#include <algorithm>

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
  if (spec.Nodes() > 1) text += fmt::format(" on {} nodes", spec.Nodes());
  if (!spec.gpu_models.empty()) text += fmt::format(" ({})", fmt::join(spec.gpu_models, " or "));
  if (spec.min_gpu_memory_mib > 0)
    text += fmt::format(" with at least {} MiB of GPU memory", spec.min_gpu_memory_mib);
  return text;
}

// Milli-GPUs as GPUs, "8" or "2.5".
std::string Gpus(int64_t milli) {
  return fmt::format("{:g}", static_cast<double>(milli) / kMilliPerGpu);
}

}  // namespace

bool IsInfeasible(WaitReason reason) {
  switch (reason) {
    case WaitReason::kInfeasibleGpuCount:
    case WaitReason::kInfeasibleTaskShape:
    case WaitReason::kInfeasibleGpuModel:
    case WaitReason::kInfeasibleNodeCount:
    case WaitReason::kUnknownQueue:
    case WaitReason::kInfeasibleQuota:
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
    case WaitReason::kInfeasibleNodeCount:
      return "infeasible_node_count";
    case WaitReason::kOverQuota:
      return "over_quota";
    case WaitReason::kCohortExhausted:
      return "cohort_exhausted";
    case WaitReason::kUnknownQueue:
      return "unknown_queue";
    case WaitReason::kInfeasibleQuota:
      return "infeasible_quota";
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
    case WaitReason::kInfeasibleNodeCount:
      return fmt::format(
          "can never run: it needs {} distinct nodes that each hold {} of its tasks, and fewer "
          "nodes can",
          spec.Nodes(), spec.tasks_per_node);
    case WaitReason::kOverQuota:
      return fmt::format(
          "waiting for quota: queue '{}' would go above its guarantee and what it "
          "may borrow with {}",
          spec.queue, ask);
    case WaitReason::kCohortExhausted:
      return fmt::format(
          "waiting for quota: the cohort of queue '{}' has no unused guarantee "
          "left to lend for {}",
          spec.queue, ask);
    case WaitReason::kUnknownQueue:
      return fmt::format("can never run: queue '{}' is not configured", spec.queue);
    case WaitReason::kInfeasibleQuota:
      return fmt::format("can never run: queue '{}' can never hold {}, even borrowing all it may",
                         spec.queue, ask);
  }
  return "unknown";
}

std::string DescribeWait(const Waiting& waiting, const JobSpec& spec) {
  if (!waiting.quota) return DescribeWait(waiting.reason, spec);
  const QuotaWait& q = *waiting.quota;
  const std::string gpus = q.model.empty() ? "GPUs" : fmt::format("{} GPUs", q.model);
  const std::string usage =
      fmt::format("queue '{}' uses {} of its {} guaranteed {} and the job asks {}", q.queue,
                  Gpus(q.used_milli), Gpus(q.guaranteed_milli), gpus, Gpus(q.ask_milli));
  switch (waiting.reason) {
    case WaitReason::kOverQuota:
      if (q.cohort.empty())
        return fmt::format("waiting for quota: {}; it has no cohort to borrow from", usage);
      return fmt::format("waiting for quota: {}; it may borrow at most {} more", usage,
                         Gpus(q.borrowing_limit_milli));
    case WaitReason::kCohortExhausted:
      return fmt::format(
          "waiting for quota: {}; cohort '{}' has only {} unused guaranteed {} "
          "to lend",
          usage, q.cohort, Gpus(std::max<int64_t>(0, q.cohort_unused_milli)), gpus);
    case WaitReason::kInfeasibleQuota:
      return fmt::format(
          "can never run: queue '{}' can never hold {} {} (guarantee {}, borrowing limit {})",
          q.queue, Gpus(q.ask_milli), gpus, Gpus(q.guaranteed_milli),
          q.borrowing_limit_milli < 0 ? "none" : Gpus(q.borrowing_limit_milli));
    default:
      return DescribeWait(waiting.reason, spec);
  }
}

const char* PreemptReasonCode(PreemptReason reason) {
  switch (reason) {
    case PreemptReason::kHigherPriority:
      return "higher_priority";
    case PreemptReason::kLasDemotion:
      return "las_demotion";
    case PreemptReason::kReclaim:
      return "reclaim";
  }
  return "unknown";
}

std::string DescribePreemption(PreemptReason reason) {
  switch (reason) {
    case PreemptReason::kHigherPriority:
      return "preempted for a job of higher priority";
    case PreemptReason::kLasDemotion:
      return "preempted for a job with less attained GPU service (2D-LAS)";
    case PreemptReason::kReclaim:
      return "preempted: its queue was borrowing quota that a queue of its cohort reclaimed to "
             "run within its guarantee";
  }
  return "unknown";
}

}  // namespace gpufleet::sched
