#pragma once

// Internal to src/sched: EASY backfill's reservation, shared by the plain and the quota cycle.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sched/rank.h"
#include "sched/types.h"

namespace gpufleet::sched {

struct Reservation {
  TimeMs shadow_time = kNever;
  int64_t spare_milli = 0;  // GPUs free at the shadow time beyond what the head needs
};

// When `needed_milli` GPUs will be free over the whole cluster: `free_milli` now, plus each of
// `ends` (when a job ends by its estimate, and the GPUs it frees). Jobs without an estimate are
// not in `ends`: they are taken never to end.
inline Reservation ReserveFor(std::vector<std::pair<TimeMs, int64_t>> ends, int64_t free_milli,
                              int64_t needed_milli) {
  // Ends in increasing order, as a sort would give them, but from a heap: the head's GPUs are
  // usually free after a few ends, and a cycle need not sort all the running jobs for that.
  const auto later = [](const auto& a, const auto& b) { return a > b; };
  std::make_heap(ends.begin(), ends.end(), later);
  Reservation reservation;
  for (auto last = ends.end(); last != ends.begin(); --last) {
    std::pop_heap(ends.begin(), last, later);
    const auto& [end, milli] = *(last - 1);
    free_milli += milli;
    if (free_milli >= needed_milli) {
      reservation.shadow_time = end;
      reservation.spare_milli = free_milli - needed_milli;
      return reservation;
    }
  }
  reservation.spare_milli = std::max<int64_t>(0, free_milli - needed_milli);
  return reservation;
}

// EASY's reservation for `head`: the jobs started this cycle (`new_ends`) and the running jobs
// with an estimate that are not preempted (`preempted(i)` for running[i]) end when estimated.
template <typename Preempted>
Reservation ReserveForHead(const JobSpec& head, std::vector<std::pair<TimeMs, int64_t>> new_ends,
                           std::span<const RunningJob> running, Preempted preempted, TimeMs now,
                           int64_t free_milli) {
  for (size_t i = 0; i < running.size(); ++i) {
    const RunningJob& job = running[i];
    if (!job.spec.runtime_estimate || preempted(i)) continue;
    new_ends.emplace_back(std::max(now, job.start_time + *job.spec.runtime_estimate),
                          job.spec.TotalGpuMilli());
  }
  return ReserveFor(std::move(new_ends), free_milli, head.TotalGpuMilli());
}

}  // namespace gpufleet::sched
