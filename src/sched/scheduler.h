#pragma once

#include <span>

#include "sched/policy.h"
#include "sched/types.h"

namespace gpufleet::sched {

// One scheduling cycle. Pure: the result depends only on the arguments, and the same arguments
// always give the same decisions. `running` must describe allocations that fit the cluster
// without double-allocating any GPU share (std::invalid_argument otherwise).
Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob> pending, TimeMs now, const SchedulerConfig& config);

// Whether the job could ever run on this cluster, were it empty; the reason if not.
std::optional<WaitReason> CheckFeasible(const Cluster& cluster, const JobSpec& spec);

}  // namespace gpufleet::sched
