#include "sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "sched/allocator.h"

namespace gpufleet::sched {
namespace {

constexpr TimeMs kNever = std::numeric_limits<TimeMs>::max();

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

int64_t LasQueue(int64_t attained_gpu_ms, const SchedulerConfig& config) {
  int64_t queue = 0;
  for (int64_t limit_gpu_s : config.las_queue_limits_gpu_s)
    if (attained_gpu_ms >= limit_gpu_s * kMsPerSecond) ++queue;
  return queue;
}

Rank RankOf(const JobSpec& spec, int64_t attained_gpu_ms, TimeMs waiting_since, TimeMs now,
            const SchedulerConfig& config) {
  Rank rank;
  rank.id = spec.id;
  rank.cls.first = -static_cast<int64_t>(spec.priority);
  switch (config.order) {
    case QueueOrder::kFifo:
      rank.tiebreak1 = spec.submit_time;
      break;
    case QueueOrder::kSjf:
      rank.tiebreak1 = spec.runtime_estimate.value_or(kNever);
      rank.tiebreak2 = spec.submit_time;
      break;
    case QueueOrder::kLas: {
      int64_t queue = LasQueue(attained_gpu_ms, config);
      if (config.las_starvation_factor > 0 && waiting_since >= 0 && spec.gpu_milli_per_task > 0) {
        // Tiresias promotes a job that waited longer than factor x its run so far.
        const double gpus = static_cast<double>(spec.TotalGpuMilli()) / kMilliPerGpu;
        const double ran_ms = static_cast<double>(attained_gpu_ms) / gpus;
        if (ran_ms > 0 &&
            static_cast<double>(now - waiting_since) >= config.las_starvation_factor * ran_ms)
          queue = 0;
      }
      rank.cls.second = queue;
      rank.tiebreak1 = spec.submit_time;
      break;
    }
  }
  return rank;
}

// Everything placement depends on; jobs of one shape fit or fail together within a cycle.
struct Shape {
  const JobSpec* spec;
  bool operator==(const Shape& other) const {
    const JobSpec& a = *spec;
    const JobSpec& b = *other.spec;
    return a.tasks == b.tasks && a.gpu_milli_per_task == b.gpu_milli_per_task &&
           a.cpu_milli_per_task == b.cpu_milli_per_task &&
           a.memory_mib_per_task == b.memory_mib_per_task &&
           a.min_gpu_memory_mib == b.min_gpu_memory_mib && a.gpu_models == b.gpu_models;
  }
};
struct ShapeHash {
  size_t operator()(const Shape& shape) const {
    const JobSpec& s = *shape.spec;
    size_t h = std::hash<int64_t>{}(s.tasks);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<int64_t>{}(s.gpu_milli_per_task));
    mix(std::hash<int64_t>{}(s.cpu_milli_per_task));
    mix(std::hash<int64_t>{}(s.memory_mib_per_task));
    mix(std::hash<int64_t>{}(s.min_gpu_memory_mib));
    for (const std::string& model : s.gpu_models)
      mix(std::hash<std::string>{}(model));
    return h;
  }
};

struct Victim {
  Rank rank;
  const RunningJob* job;
  bool taken = false;
};

class Cycle {
 public:
  Cycle(const Cluster& cluster, std::span<const RunningJob> running, TimeMs now,
        const SchedulerConfig& config)
      : running_(running), now_(now), config_(config), allocator_(cluster) {
    for (const RunningJob& job : running)
      allocator_.Commit(job.spec, job.allocation);
  }
  // `capacity` already holds the running jobs; the cycle works on a copy.
  Cycle(const Allocator& capacity, std::span<const RunningJob> running, TimeMs now,
        const SchedulerConfig& config)
      : running_(running), now_(now), config_(config), allocator_(capacity) {}

  Decisions Run(std::span<const PendingJob* const> pending, const CycleOptions& options) {
    std::vector<const PendingJob*> sorted;
    if (!options.pending_sorted) {
      std::vector<std::pair<Rank, const PendingJob*>> ranked;
      ranked.reserve(pending.size());
      for (const PendingJob* job : pending)
        ranked.emplace_back(RankOfPending(*job), job);
      // Callers often keep the queue in order already; skip the sort then.
      if (!std::is_sorted(ranked.begin(), ranked.end(), RankLess))
        std::sort(ranked.begin(), ranked.end(), RankLess);
      sorted.reserve(ranked.size());
      for (const auto& entry : ranked)
        sorted.push_back(entry.second);
      pending = sorted;
    }

    if (options.explain_all_waiting) decisions_.waiting.reserve(pending.size());
    for (const PendingJob* job : pending) {
      const Rank rank = RankOfPending(*job);
      if (!options.explain_all_waiting && NothingMoreCanStart(rank, options)) break;
      Consider(*job, rank);
    }
    return std::move(decisions_);
  }

 private:
  // Victims are gathered and sorted the first time a preemption is considered: most cycles never
  // need them.
  void CollectVictims() {
    if (victims_collected_ || !(config_.preempt || config_.order == QueueOrder::kLas)) return;
    victims_collected_ = true;
    for (const RunningJob& job : running_) {
      if (!job.spec.preemptible) continue;
      victims_.push_back({RankOf(job.spec, job.attained_gpu_ms, -1, now_, config_), &job, false});
    }
    // Worst rank first; among equals the most recently started, which loses the least progress.
    std::sort(victims_.begin(), victims_.end(), [](const Victim& a, const Victim& b) {
      if (a.rank.cls != b.rank.cls) return b.rank.cls < a.rank.cls;
      if (a.job->start_time != b.job->start_time) return a.job->start_time > b.job->start_time;
      return a.job->spec.id > b.job->spec.id;
    });
  }

  static bool RankLess(const std::pair<Rank, const PendingJob*>& a,
                       const std::pair<Rank, const PendingJob*>& b) {
    return a.first < b.first;
  }

  Rank RankOfPending(const PendingJob& job) const {
    const TimeMs since = job.last_run_end >= 0 ? job.last_run_end : job.spec.submit_time;
    return RankOf(job.spec, job.attained_gpu_ms, since, now_, config_);
  }

  // Jobs come in order, so once this holds for one job it holds for every job behind it.
  bool NothingMoreCanStart(const Rank& rank, const CycleOptions& options) {
    if (head_blocked_ && config_.backfill == Backfill::kNone) return true;
    if (allocator_.FreeGpuMilli() > 0 || options.cpu_only_pending != 0) return false;
    // No GPU is free: only a preemption could start a job, and only by a strictly better class.
    if (!victims_collected_) return !CouldPreempt(rank);
    while (first_untaken_ < victims_.size() && victims_[first_untaken_].taken)
      ++first_untaken_;
    return first_untaken_ == victims_.size() || !(rank.cls < victims_[first_untaken_].rank.cls);
  }

  // Whether some preemptible running job ranks in a strictly worse class than `rank`: the cheap
  // test, without ranking victims, that spares most cycles the sort in CollectVictims.
  bool CouldPreempt(const Rank& rank) {
    if (!(config_.preempt || config_.order == QueueOrder::kLas)) return false;
    if (!worst_running_class_) {
      worst_running_class_.emplace();
      for (const RunningJob& job : running_) {
        if (!job.spec.preemptible) continue;
        const auto cls = RankOf(job.spec, job.attained_gpu_ms, -1, now_, config_).cls;
        if (!*worst_running_class_ || **worst_running_class_ < cls) *worst_running_class_ = cls;
      }
    }
    return *worst_running_class_ && rank.cls < **worst_running_class_;
  }

  void Consider(const PendingJob& job, const Rank& rank) {
    const JobSpec& spec = job.spec;
    // A job that can never run says so even when it is not its turn: "blocked" or "reserved"
    // would tell its owner to wait for something that will not come.
    if (head_blocked_ && config_.backfill == Backfill::kNone) {
      Wait(spec, NeverFits(spec).value_or(WaitReason::kBlockedByQueueHead));
      return;
    }
    bool uses_reserve = false;
    if (reservation_) {
      const bool ends_in_time =
          spec.runtime_estimate && now_ + *spec.runtime_estimate <= reservation_->shadow_time;
      uses_reserve = !ends_in_time;
      if (uses_reserve && spec.TotalGpuMilli() > reservation_->spare_milli) {
        Wait(spec, NeverFits(spec).value_or(WaitReason::kReservedForEarlierJob));
        return;
      }
    }

    const Shape shape{&spec};
    auto failed = failed_shapes_.find(shape);
    if (failed == failed_shapes_.end()) {
      if (auto allocation = allocator_.Place(spec, config_.placement)) {
        if (uses_reserve) reservation_->spare_milli -= spec.TotalGpuMilli();
        Start(spec, std::move(*allocation));
        return;
      }
      // Only feasible shapes enter failed_shapes_, so a shape found there needs no check.
      if (const auto infeasible = NeverFits(spec)) {
        Wait(spec, *infeasible);  // never blocks the jobs behind it
        return;
      }
    }
    if (CouldPreempt(rank)) {
      CollectVictims();
      if (TryPreempt(spec, rank)) return;
    }

    if (failed == failed_shapes_.end())
      failed = failed_shapes_.emplace(shape, allocator_.WhyNotNow(spec)).first;
    Wait(spec, failed->second);
    if (!head_blocked_) {
      head_blocked_ = true;
      if (config_.backfill == Backfill::kEasy) reservation_ = Reserve(spec);
    }
  }

  void Start(const JobSpec& spec, Allocation allocation) {
    if (spec.runtime_estimate)
      new_ends_.emplace_back(now_ + *spec.runtime_estimate, spec.TotalGpuMilli());
    decisions_.placements.push_back({spec.id, std::move(allocation)});
  }

  void Wait(const JobSpec& spec, WaitReason reason) {
    decisions_.waiting.push_back({spec.id, reason});
  }

  std::optional<WaitReason> NeverFits(const JobSpec& spec) {
    const Shape shape{&spec};
    auto it = infeasible_shapes_.find(shape);
    if (it != infeasible_shapes_.end()) return it->second;
    return infeasible_shapes_.emplace(shape, allocator_.WhyNeverFits(spec)).first->second;
  }

  // Frees room by stopping running jobs of a strictly worse class, worst first, keeping back any
  // victim the job turns out not to need. All or nothing: if even every candidate is not enough,
  // nothing is preempted.
  bool TryPreempt(const JobSpec& spec, const Rank& rank) {
    const std::pair<Shape, std::pair<int64_t, int64_t>> memo_key{Shape{&spec}, rank.cls};
    for (const auto& [shape, cls] : failed_preemptions_)
      if (cls == memo_key.second && shape == memo_key.first) return false;

    // Candidates are the untaken victims of a strictly worse class: a prefix of victims_, which
    // is sorted worst first. Walking it only as far as needed keeps a cycle with many
    // preemptions linear in the number of running jobs.
    while (first_untaken_ < victims_.size() && victims_[first_untaken_].taken)
      ++first_untaken_;
    auto for_each_candidate = [&](auto&& visit) {
      for (size_t i = first_untaken_; i < victims_.size(); ++i) {
        Victim& victim = victims_[i];
        if (!(rank.cls < victim.rank.cls)) return;
        if (!victim.taken && !visit(victim)) return;
      }
    };
    bool any_candidate = false;
    int64_t reachable = allocator_.FreeGpuMilli();
    for_each_candidate([&](Victim& victim) {
      any_candidate = true;
      reachable += victim.job->spec.TotalGpuMilli();
      return reachable < spec.TotalGpuMilli();  // enough to know preempting may work
    });
    if (!any_candidate || reachable < spec.TotalGpuMilli()) {
      failed_preemptions_.push_back(memo_key);
      return false;
    }

    std::vector<Victim*> released;
    std::optional<Allocation> allocation;
    for_each_candidate([&](Victim& victim) {
      allocator_.Release(victim.job->spec, victim.job->allocation);
      released.push_back(&victim);
      if (allocator_.FreeGpuMilli() < spec.TotalGpuMilli() && spec.gpu_milli_per_task > 0)
        return true;
      allocation = allocator_.Place(spec, config_.placement);
      return !allocation.has_value();
    });
    if (!allocation) {
      for (Victim* victim : released)
        allocator_.Commit(victim->job->spec, victim->job->allocation);
      failed_preemptions_.push_back(memo_key);
      return false;
    }
    // Give back victims the placement does not need, best ranked first.
    std::vector<Victim*> needed;
    for (auto it = released.rbegin(); it != released.rend(); ++it) {
      Victim* victim = *it;
      if (it == released.rbegin()) {
        needed.push_back(victim);  // the last release is what made the job fit
        continue;
      }
      allocator_.Release(spec, *allocation);
      allocator_.Commit(victim->job->spec, victim->job->allocation);
      if (auto without = allocator_.Place(spec, config_.placement)) {
        allocation = std::move(without);
      } else {
        allocator_.Release(victim->job->spec, victim->job->allocation);
        allocation = allocator_.Place(spec, config_.placement);
        needed.push_back(victim);
      }
    }
    std::sort(needed.begin(), needed.end(),
              [](const Victim* a, const Victim* b) { return a->job->spec.id < b->job->spec.id; });
    for (Victim* victim : needed) {
      victim->taken = true;
      const bool demoted =
          config_.order == QueueOrder::kLas && victim->rank.cls.first == rank.cls.first;
      decisions_.preemptions.push_back(
          {victim->job->spec.id, spec.id,
           demoted ? PreemptReason::kLasDemotion : PreemptReason::kHigherPriority});
    }
    failed_shapes_.clear();  // capacity grew: shapes that failed before may fit now
    Start(spec, std::move(*allocation));
    return true;
  }

  struct Reservation {
    TimeMs shadow_time = kNever;
    int64_t spare_milli = 0;  // GPUs free at the shadow time beyond what the head needs
  };

  // EASY backfill's reservation for the first job that does not fit, counted in GPUs over the
  // whole cluster: the shadow time is when enough running jobs will have ended (by their
  // estimates) for it. Jobs without an estimate are taken never to end.
  Reservation Reserve(const JobSpec& head) const {
    std::vector<std::pair<TimeMs, int64_t>> ends = new_ends_;
    std::unordered_set<const RunningJob*> preempted;
    for (const Victim& victim : victims_)
      if (victim.taken) preempted.insert(victim.job);
    for (const RunningJob& job : running_) {
      if (!job.spec.runtime_estimate || preempted.count(&job) > 0) continue;
      ends.emplace_back(std::max(now_, job.start_time + *job.spec.runtime_estimate),
                        job.spec.TotalGpuMilli());
    }
    std::sort(ends.begin(), ends.end());
    Reservation reservation;
    int64_t free = allocator_.FreeGpuMilli();
    for (const auto& [end, milli] : ends) {
      free += milli;
      if (free >= head.TotalGpuMilli()) {
        reservation.shadow_time = end;
        reservation.spare_milli = free - head.TotalGpuMilli();
        return reservation;
      }
    }
    reservation.spare_milli = std::max<int64_t>(0, free - head.TotalGpuMilli());
    return reservation;
  }

  std::span<const RunningJob> running_;
  TimeMs now_;
  const SchedulerConfig& config_;
  Allocator allocator_;

  Decisions decisions_;
  std::vector<Victim> victims_;
  bool victims_collected_ = false;
  // The worst class of a preemptible running job (none if there is none), once computed.
  std::optional<std::optional<std::pair<int64_t, int64_t>>> worst_running_class_;
  size_t first_untaken_ = 0;  // victims_ before this are all taken
  std::unordered_map<Shape, WaitReason, ShapeHash> failed_shapes_;
  std::unordered_map<Shape, std::optional<WaitReason>, ShapeHash> infeasible_shapes_;
  std::vector<std::pair<Shape, std::pair<int64_t, int64_t>>> failed_preemptions_;
  std::vector<std::pair<TimeMs, int64_t>> new_ends_;  // estimated ends of jobs started this cycle
  bool head_blocked_ = false;
  std::optional<Reservation> reservation_;
};

}  // namespace

Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options) {
  return Cycle(cluster, running, now, config).Run(pending, options);
}

Decisions Schedule(const Allocator& capacity, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options) {
  return Cycle(capacity, running, now, config).Run(pending, options);
}

Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob> pending, TimeMs now, const SchedulerConfig& config) {
  std::vector<const PendingJob*> pointers;
  pointers.reserve(pending.size());
  for (const PendingJob& job : pending)
    pointers.push_back(&job);
  return Schedule(cluster, running, pointers, now, config, CycleOptions{});
}

bool PendingBefore(const PendingJob& a, const PendingJob& b, TimeMs now,
                   const SchedulerConfig& config) {
  auto rank = [&](const PendingJob& job) {
    const TimeMs since = job.last_run_end >= 0 ? job.last_run_end : job.spec.submit_time;
    return RankOf(job.spec, job.attained_gpu_ms, since, now, config);
  };
  return rank(a) < rank(b);
}

std::optional<WaitReason> CheckFeasible(const Cluster& cluster, const JobSpec& spec) {
  return Allocator(cluster).WhyNeverFits(spec);
}

}  // namespace gpufleet::sched
