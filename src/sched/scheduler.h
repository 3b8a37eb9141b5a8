#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sched/allocator.h"
#include "sched/policy.h"
#include "sched/types.h"

namespace gpufleet::sched {

// One scheduling cycle. Pure: the result depends only on the arguments, and the same arguments
// always give the same decisions. `running` must describe allocations that fit the cluster
// without double-allocating any GPU share (std::invalid_argument otherwise).
Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob> pending, TimeMs now, const SchedulerConfig& config);

// What the caller knows about the pending queue, and how much of an answer it needs. As long as
// what it claims is true, the placements and preemptions are the same as without it.
struct CycleOptions {
  // `pending` is already in the order PendingBefore() defines, so the cycle does not sort it.
  bool pending_sorted = false;
  // How many pending jobs ask for no GPU at all; -1 when unknown.
  int64_t cpu_only_pending = -1;
  // When false the cycle computes no wait reason and leaves `waiting` empty, and it stops as soon
  // as no further job can start; once no job left can preempt, it passes over a job asking for
  // more GPUs than are free without looking further. The simulator uses this so that a cycle
  // does not touch thousands of waiting jobs that cannot start, and asks again with true when it
  // needs to say why a job waits.
  bool explain_all_waiting = true;
  // How many of the pending jobs belong to each of config.queues, in that order; empty when
  // unknown. Strict FIFO then stops once every queue is blocked or has no job left behind, instead
  // of passing over every job of the queues whose heads wait while some queue has none waiting.
  std::span<const int64_t> pending_per_queue;
  // With pending_sorted: for each pending job, in the same order, the index of its queue in
  // config.queues (-1: none). Strict FIFO then passes over the jobs of a blocked queue without
  // reading them.
  std::span<const int32_t> pending_queue_index;
};

// The same cycle over pointers to pending jobs, with hints about them.
Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options);

// The same cycle for a caller that keeps the cluster's capacity up to date itself (the simulator
// commits and releases jobs as they start and stop): `capacity` must hold exactly the allocations
// of `running`. It is copied, not changed, so a cycle costs O(cluster) instead of re-committing
// every running job.
Decisions Schedule(const Allocator& capacity, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options);

// The same cycle working on `capacity` itself instead of a copy, so that a cycle that decides
// little costs little. On return `capacity` holds the cycle's own decisions: the preempted jobs
// released and the placed jobs committed, exactly as if the caller had done so (an Allocator's
// state does not depend on the order of its changes). Still a function of its arguments: the
// decisions are those of the overloads above. If it throws (`capacity` does not match
// `running`), `capacity` is left in an unspecified state.
Decisions ScheduleInPlace(Allocator& capacity, std::span<const RunningJob> running,
                          std::span<const PendingJob* const> pending, TimeMs now,
                          const SchedulerConfig& config, const CycleOptions& options);

// The queue order of the configured policy: whether `a` is considered before `b` at `now`. Only
// LAS with a starvation factor makes this change over time for a job that waits.
bool PendingBefore(const PendingJob& a, const PendingJob& b, TimeMs now,
                   const SchedulerConfig& config);

// Whether the job could ever run on this cluster, were it empty; the reason if not.
std::optional<WaitReason> CheckFeasible(const Cluster& cluster, const JobSpec& spec);

// CheckFeasible for many jobs against one cluster, as the server checks every submission: the
// cluster's allocator is built once and each job shape's answer is remembered, so a check costs a
// hash lookup instead of a pass over 10,000 nodes.
class FeasibilityChecker {
 public:
  explicit FeasibilityChecker(Cluster cluster);
  FeasibilityChecker(const FeasibilityChecker&) = delete;
  FeasibilityChecker& operator=(const FeasibilityChecker&) = delete;
  std::optional<WaitReason> Check(const JobSpec& spec);
  const Cluster& cluster() const { return cluster_; }

 private:
  static constexpr size_t kMaxShapes = 4096;  // past it the answers are forgotten and relearnt
  Cluster cluster_;
  Allocator allocator_;         // over cluster_
  std::deque<JobSpec> shapes_;  // the keys' specs
  std::unordered_map<size_t, std::vector<std::pair<const JobSpec*, std::optional<WaitReason>>>>
      answers_;  // by ShapeHash
};

}  // namespace gpufleet::sched
