#pragma once

#include <span>

#include "sched/allocator.h"
#include "sched/scheduler.h"

// Internal to src/sched: the scheduling cycle with team queues (SchedulerConfig::queues not
// empty), with ScheduleInPlace's contract.
namespace gpufleet::sched {

Decisions RunQuotaCycle(Allocator& capacity, std::span<const RunningJob> running,
                        std::span<const PendingJob* const> pending, TimeMs now,
                        const SchedulerConfig& config, const CycleOptions& options);

}  // namespace gpufleet::sched
