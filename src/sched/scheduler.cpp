#include "sched/scheduler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "sched/allocator.h"
#include "sched/quota_cycle.h"
#include "sched/rank.h"
#include "sched/reservation.h"
#include "sched/shape.h"

namespace gpufleet::sched {

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
    case QueueOrder::kFairShare: {
      // Fair share orders but never preempts by itself: the factor is not part of the class.
      const auto factor = config.fair_share_factor.find(spec.queue);
      const double value = factor == config.fair_share_factor.end() ? 1.0 : factor->second;
      rank.tiebreak1 = -std::llround(value * 1e12);
      rank.tiebreak2 = spec.submit_time;
      break;
    }
  }
  return rank;
}

namespace {

using Class = std::pair<int64_t, int64_t>;

bool PlainWholeGpus(const JobSpec& spec) {
  return spec.gpu_milli_per_task >= kMilliPerGpu && spec.cpu_milli_per_task == 0 &&
         spec.memory_mib_per_task == 0 && spec.gpu_models.empty() && spec.min_gpu_memory_mib == 0;
}

struct Victim {
  Class cls;
  const RunningJob* job;
  bool taken = false;
};

class Cycle {
 public:
  // `capacity` already holds the running jobs; the cycle works on it in place and leaves its own
  // decisions applied.
  Cycle(Allocator& capacity, std::span<const RunningJob> running, TimeMs now,
        const SchedulerConfig& config)
      : running_(running), now_(now), config_(config), allocator_(capacity) {}

  Decisions Run(std::span<const PendingJob* const> pending, const CycleOptions& options) {
    explain_ = options.explain_all_waiting;
    std::vector<const PendingJob*> sorted;
    if (!options.pending_sorted)
      pending = SortedByRank(
          pending, [this](const PendingJob& job) { return RankOfPending(job); }, sorted);

    if (explain_) {
      decisions_.waiting.reserve(pending.size());
      for (const PendingJob* job : pending)
        Consider(*job, RankOfPending(*job), false);
      decisions_.considered = static_cast<int64_t>(pending.size());
      return std::move(decisions_);
    }

    // Without explanations a job that cannot start needs no further look. Jobs come in rank
    // order and victims are only ever taken, so once one job can neither be placed nor preempt,
    // no job behind it can preempt either ("only placing"); from then on a job that Place would
    // certainly refuse (more GPUs than are free, or more whole-GPU tasks than the nodes' free
    // GPUs hold) is passed over after a few comparisons.
    const bool may_preempt_at_all = config_.preempt || config_.order == QueueOrder::kLas;
    size_t i = 0;
    for (; i < pending.size(); ++i) {
      const JobSpec& spec = pending[i]->spec;
      const bool too_big =
          spec.gpu_milli_per_task > 0 && spec.TotalGpuMilli() > allocator_.FreeGpuMilli();
      if (only_placing_ && allocator_.FreeGpuMilli() == 0 && options.cpu_only_pending == 0) break;
      const bool cannot_place = too_big || !WholeTasksMayFit(spec);
      if (only_placing_ && cannot_place) continue;
      // Nor can a job start that asks for more than is free plus all that preemptions could
      // free. (Blocking matters to strict FIFO and EASY: their first blocked job goes the long
      // way.)
      const bool blocking_settled = head_blocked_ || config_.backfill == Backfill::kFirstFit;
      if (too_big && blocking_settled &&
          spec.TotalGpuMilli() > allocator_.FreeGpuMilli() + PreemptibleMilli())
        continue;
      // A rank decides nothing here but preemption (the list is in rank order already), so it
      // is not worked out for a cycle that cannot preempt: fair share looks up a factor for it.
      const Rank rank = may_preempt_at_all ? RankOfPending(*pending[i]) : Rank{};
      if (NothingMoreCanStart(rank, options)) break;
      if (cannot_place && blocking_settled && !MayPreempt(rank)) {
        only_placing_ = true;
        continue;
      }
      Consider(*pending[i], rank, cannot_place);
    }
    decisions_.considered = static_cast<int64_t>(i);
    return std::move(decisions_);
  }

 private:
  // Victims are gathered and sorted the first time a preemption is considered: most cycles never
  // need them. Only running jobs of a class worse than the first job to try a preemption are
  // kept: jobs come in rank order, so no later job may preempt the others. Their classes come
  // from CouldPreempt, which ranked every running job already.
  void CollectVictims(const Rank& first) {
    if (victims_collected_) return;
    victims_collected_ = true;
    preemptible_milli_ = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      if (running_[i].spec.preemptible && first.cls < running_class_[i]) {
        victims_.push_back({running_class_[i], &running_[i], false});
        preemptible_milli_ += running_[i].spec.TotalGpuMilli();
      }
    }
    preemptible_known_ = true;
    // Worst class first; among equals the most recently started, which loses the least progress.
    std::sort(victims_.begin(), victims_.end(), [](const Victim& a, const Victim& b) {
      if (a.cls != b.cls) return b.cls < a.cls;
      if (a.job->start_time != b.job->start_time) return a.job->start_time > b.job->start_time;
      return a.job->spec.id > b.job->spec.id;
    });
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
    return !MayPreempt(rank);
  }

  // At least the GPUs that preemptions could still free for any job left: those of every
  // preemptible running job, then of the untaken victims once they are collected.
  int64_t PreemptibleMilli() {
    if (!(config_.preempt || config_.order == QueueOrder::kLas)) return 0;
    if (!preemptible_known_) {
      preemptible_known_ = true;
      for (const RunningJob& job : running_)
        if (job.spec.preemptible) preemptible_milli_ += job.spec.TotalGpuMilli();
    }
    return preemptible_milli_;
  }

  // Whether a job of this rank, should it not fit, may still find a victim: some untaken
  // preemptible running job of a strictly worse class. Once false, false for every later job.
  bool MayPreempt(const Rank& rank) {
    if (!CouldPreempt(rank)) return false;
    if (!victims_collected_) return true;
    while (first_untaken_ < victims_.size() && victims_[first_untaken_].taken)
      ++first_untaken_;
    return first_untaken_ < victims_.size() && rank.cls < victims_[first_untaken_].cls;
  }

  // Whether some preemptible running job ranks in a strictly worse class than `rank`: the cheap
  // test, without sorting victims, that spares most cycles the sort in CollectVictims. Ranks
  // every running job once per cycle; CollectVictims reuses those classes.
  bool CouldPreempt(const Rank& rank) {
    if (!(config_.preempt || config_.order == QueueOrder::kLas)) return false;
    if (!running_ranked_) {
      running_ranked_ = true;
      running_class_.resize(running_.size());
      for (size_t i = 0; i < running_.size(); ++i) {
        const RunningJob& job = running_[i];
        if (!job.spec.preemptible) continue;
        const Class cls = RankOf(job.spec, job.attained_gpu_ms, -1, now_, config_).cls;
        running_class_[i] = cls;
        if (!worst_running_class_ || *worst_running_class_ < cls) worst_running_class_ = cls;
      }
    }
    return worst_running_class_ && rank.cls < *worst_running_class_;
  }

  // False when Place certainly refuses the job for want of free whole GPUs. The bounds are
  // kept per task size until the next placement changes them.
  bool WholeTasksMayFit(const JobSpec& spec) {
    const int32_t whole = spec.WholeGpusPerTask();
    if (whole == 0) return true;
    if (static_cast<size_t>(whole) >= whole_tasks_at_most_.size())
      return allocator_.WholeGpuTasksAtMost(whole) >= spec.tasks;
    int64_t& at_most = whole_tasks_at_most_[static_cast<size_t>(whole)];
    if (at_most < 0) at_most = allocator_.WholeGpuTasksAtMost(whole);
    return at_most >= spec.tasks;
  }

  // `cannot_place`: a job Place would certainly refuse now; only set without explanations,
  // where the cycle does not try.
  void Consider(const PendingJob& job, const Rank& rank, bool cannot_place) {
    const JobSpec& spec = job.spec;
    // A job that can never run says so even when it is not its turn: "blocked" or "reserved"
    // would tell its owner to wait for something that will not come.
    if (head_blocked_ && config_.backfill == Backfill::kNone) {
      Wait(spec, [&] { return NeverFits(spec).value_or(WaitReason::kBlockedByQueueHead); });
      return;
    }
    bool uses_reserve = false;
    if (reservation_) {
      const bool ends_in_time =
          spec.runtime_estimate && now_ + *spec.runtime_estimate <= reservation_->shadow_time;
      uses_reserve = !ends_in_time;
      if (uses_reserve && spec.TotalGpuMilli() > reservation_->spare_milli) {
        Wait(spec, [&] { return NeverFits(spec).value_or(WaitReason::kReservedForEarlierJob); });
        return;
      }
    }

    // A job that cannot be placed skips the memo of failed shapes: free capacity only shrinks
    // until a preemption, which clears the memo. So does, without explanations, a job of whole
    // GPUs of any model and nothing else, which Place refuses in a few steps (it counts nodes by
    // free GPUs), sooner than the memo answers.
    const bool skip_memo = cannot_place || (!explain_ && PlainWholeGpus(spec));
    const Shape shape{&spec};
    auto failed = failed_shapes_.end();
    if (!skip_memo) failed = failed_shapes_.find(shape);
    const bool known_failed = failed != failed_shapes_.end();
    if (!known_failed) {
      if (!cannot_place) {
        if (auto allocation = allocator_.Place(spec, config_.placement)) {
          if (uses_reserve) reservation_->spare_milli -= spec.TotalGpuMilli();
          Start(spec, std::move(*allocation));
          return;
        }
      }
      // Only feasible shapes enter failed_shapes_ with explanations, so a shape found there
      // needs no check. Without them the check only matters where an infeasible job must not
      // block the jobs behind it (strict FIFO, EASY); elsewhere such a job ends up waiting all
      // the same, as no preemption can make room for it.
      if (explain_ || (!head_blocked_ && config_.backfill != Backfill::kFirstFit)) {
        if (const auto infeasible = NeverFits(spec)) {
          Wait(spec, [&] { return *infeasible; });  // never blocks the jobs behind it
          return;
        }
      }
    }
    if (CouldPreempt(rank)) {
      CollectVictims(rank);
      if (TryPreempt(spec, rank)) return;
    }

    if (!known_failed && !skip_memo) {
      // Why it does not fit is worked out only when someone will read it.
      failed =
          failed_shapes_
              .emplace(shape, explain_ ? allocator_.WhyNotNow(spec) : WaitReason::kInsufficientGpus)
              .first;
    }
    Wait(spec, [&] { return failed->second; });
    if (!head_blocked_) {
      head_blocked_ = true;
      if (config_.backfill == Backfill::kEasy) reservation_ = Reserve(spec);
    }
    if (!explain_ && !MayPreempt(rank)) only_placing_ = true;  // see Run
  }

  void Start(const JobSpec& spec, Allocation allocation) {
    whole_tasks_at_most_.fill(-1);  // capacity changed
    if (spec.runtime_estimate)
      new_ends_.emplace_back(now_ + *spec.runtime_estimate, spec.TotalGpuMilli());
    decisions_.placements.push_back({spec.id, std::move(allocation)});
  }

  // Records a waiting job; its reason is worked out only when explanations were asked for.
  template <typename Reason>
  void Wait(const JobSpec& spec, Reason&& reason) {
    if (explain_) decisions_.waiting.push_back({spec.id, reason(), std::nullopt});
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
    const std::pair<Shape, Class> memo_key{Shape{&spec}, rank.cls};
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
        if (!(rank.cls < victim.cls)) return;
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
      preemptible_milli_ -= victim->job->spec.TotalGpuMilli();
      const bool demoted = config_.order == QueueOrder::kLas && victim->cls.first == rank.cls.first;
      decisions_.preemptions.push_back(
          {victim->job->spec.id, spec.id,
           demoted ? PreemptReason::kLasDemotion : PreemptReason::kHigherPriority});
    }
    failed_shapes_.clear();  // capacity grew: shapes that failed before may fit now
    Start(spec, std::move(*allocation));
    return true;
  }

  // EASY backfill's reservation for the first job that does not fit, counted in GPUs over the
  // whole cluster: the shadow time is when enough running jobs will have ended (by their
  // estimates) for it. Jobs without an estimate are taken never to end.
  Reservation Reserve(const JobSpec& head) const {
    std::unordered_set<const RunningJob*> preempted;
    for (const Victim& victim : victims_)
      if (victim.taken) preempted.insert(victim.job);
    return ReserveForHead(
        head, new_ends_, running_, [&](size_t i) { return preempted.count(&running_[i]) > 0; },
        now_, allocator_.FreeGpuMilli());
  }

  std::span<const RunningJob> running_;
  TimeMs now_;
  const SchedulerConfig& config_;
  Allocator& allocator_;
  bool explain_ = true;
  bool only_placing_ = false;  // no job left may preempt (without explanations only)
  // WholeGpuTasksAtMost by task size, -1 until asked for since the last placement.
  std::array<int64_t, 17> whole_tasks_at_most_ = MakeUnknown();
  static std::array<int64_t, 17> MakeUnknown() {
    std::array<int64_t, 17> unknown;
    unknown.fill(-1);
    return unknown;
  }
  bool preemptible_known_ = false;
  int64_t preemptible_milli_ = 0;  // see PreemptibleMilli

  Decisions decisions_;
  std::vector<Victim> victims_;
  bool victims_collected_ = false;
  // Preemption classes of the running jobs (by position; meaningless for non-preemptible ones)
  // and the worst of them, once ranked.
  bool running_ranked_ = false;
  std::vector<Class> running_class_;
  std::optional<Class> worst_running_class_;
  size_t first_untaken_ = 0;  // victims_ before this are all taken
  std::unordered_map<Shape, WaitReason, ShapeHash> failed_shapes_;
  std::unordered_map<Shape, std::optional<WaitReason>, ShapeHash> infeasible_shapes_;
  std::vector<std::pair<Shape, Class>> failed_preemptions_;
  std::vector<std::pair<TimeMs, int64_t>> new_ends_;  // estimated ends of jobs started this cycle
  bool head_blocked_ = false;
  std::optional<Reservation> reservation_;
};

}  // namespace

Decisions Schedule(const Cluster& cluster, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options) {
  Allocator allocator(cluster);
  for (const RunningJob& job : running)
    allocator.Commit(job.spec, job.allocation);
  return ScheduleInPlace(allocator, running, pending, now, config, options);
}

Decisions Schedule(const Allocator& capacity, std::span<const RunningJob> running,
                   std::span<const PendingJob* const> pending, TimeMs now,
                   const SchedulerConfig& config, const CycleOptions& options) {
  Allocator scratch(capacity);
  return ScheduleInPlace(scratch, running, pending, now, config, options);
}

Decisions ScheduleInPlace(Allocator& capacity, std::span<const RunningJob> running,
                          std::span<const PendingJob* const> pending, TimeMs now,
                          const SchedulerConfig& config, const CycleOptions& options) {
  // The target workload travels with the config; the allocator keeps it, and what it computed
  // for it, while it stays the same.
  if (config.placement == PlacementPolicy::kFgd) capacity.SetTargetWorkload(config.target_workload);
  // Quotas take their own cycle, so that without queues every decision stays what it was.
  if (!config.queues.empty())
    return RunQuotaCycle(capacity, running, pending, now, config, options);
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

FeasibilityChecker::FeasibilityChecker(Cluster cluster)
    : cluster_(std::move(cluster)), allocator_(cluster_) {}

std::optional<WaitReason> FeasibilityChecker::Check(const JobSpec& spec) {
  const Shape shape{&spec};
  auto& bucket = answers_[ShapeHash{}(shape)];
  for (const auto& [known, answer] : bucket)
    if (Shape{known} == shape) return answer;
  if (shapes_.size() >= kMaxShapes) {
    answers_.clear();
    shapes_.clear();
    return Check(spec);
  }
  // The whole spec: Shape compares whichever of its fields placement depends on.
  const JobSpec& key = shapes_.emplace_back(spec);
  std::optional<WaitReason> answer = allocator_.WhyNeverFits(spec);
  bucket.emplace_back(&key, answer);
  return answer;
}

}  // namespace gpufleet::sched
