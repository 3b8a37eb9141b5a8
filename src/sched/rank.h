#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "core/job.h"
#include "sched/policy.h"
#include "sched/types.h"

// Internal to src/sched: the queue order shared by the plain and the quota cycle.
namespace gpufleet::sched {

inline constexpr TimeMs kNever = std::numeric_limits<TimeMs>::max();

// Lexicographic rank: smaller runs first. `cls` is the part that preemption compares: a job may
// only preempt jobs of a strictly worse class, never a peer that merely arrived later.
struct Rank {
  std::pair<int64_t, int64_t> cls;
  int64_t tiebreak1 = 0;
  int64_t tiebreak2 = 0;
  JobId id = 0;
  auto Tuple() const { return std::tie(cls, tiebreak1, tiebreak2, id); }
  bool operator<(const Rank& other) const { return Tuple() < other.Tuple(); }
};

// `pending` in rank order (`rank_of` gives each job's rank): `pending` itself when already sorted,
// else a sorted copy kept in `storage`. Callers often keep their queue in order; then no sort.
template <typename RankOfJob>
std::span<const PendingJob* const> SortedByRank(std::span<const PendingJob* const> pending,
                                                RankOfJob rank_of,
                                                std::vector<const PendingJob*>& storage) {
  std::vector<std::pair<Rank, const PendingJob*>> ranked;
  ranked.reserve(pending.size());
  for (const PendingJob* job : pending)
    ranked.emplace_back(rank_of(*job), job);
  auto less = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (std::is_sorted(ranked.begin(), ranked.end(), less)) return pending;
  std::sort(ranked.begin(), ranked.end(), less);
  storage.clear();
  storage.reserve(ranked.size());
  for (const auto& entry : ranked)
    storage.push_back(entry.second);
  return storage;
}

inline int64_t LasQueue(int64_t attained_gpu_ms, const SchedulerConfig& config) {
  int64_t queue = 0;
  for (int64_t limit_gpu_s : config.las_queue_limits_gpu_s)
    if (attained_gpu_ms >= limit_gpu_s * kMsPerSecond) ++queue;
  return queue;
}

// RankOf(spec, attained_gpu_ms, -1, now, config).cls, the class of a running job (it waits for
// nothing, so no starvation promotion), inline: the quota cycle needs it for every running job
// in every cycle.
inline std::pair<int64_t, int64_t> RunningClassOf(const JobSpec& spec, int64_t attained_gpu_ms,
                                                  const SchedulerConfig& config) {
  return {-static_cast<int64_t>(spec.priority),
          config.order == QueueOrder::kLas ? LasQueue(attained_gpu_ms, config) : 0};
}

Rank RankOf(const JobSpec& spec, int64_t attained_gpu_ms, TimeMs waiting_since, TimeMs now,
            const SchedulerConfig& config);

}  // namespace gpufleet::sched
