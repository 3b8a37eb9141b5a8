// The scheduling cycle with team queues: Kueue-style admission against guaranteed quotas with
// cohort borrowing, reclaim of borrowed quota, and priority preemption inside a queue
// (docs/quotas.md). Kept apart from the plain cycle so that, without queues, nothing changes.
#include "sched/quota_cycle.h"

#include <algorithm>
#include <deque>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "sched/rank.h"
#include "sched/reservation.h"
#include "sched/shape.h"

namespace gpufleet::sched {

std::optional<std::string> ValidateQueues(std::span<const QueueConfig> queues) {
  std::set<std::string_view> names;
  for (const QueueConfig& queue : queues) {
    if (queue.name.empty()) return "a queue needs a name";
    if (!names.insert(queue.name).second)
      return fmt::format("queue '{}' is given twice", queue.name);
    if (queue.guaranteed_milli < 0)
      return fmt::format("queue '{}': the guarantee must not be negative", queue.name);
    for (const auto& [model, milli] : queue.guaranteed_milli_by_model) {
      if (model.empty()) return fmt::format("queue '{}': a GPU model needs a name", queue.name);
      if (milli < 0)
        return fmt::format("queue '{}': the guarantee for {} must not be negative", queue.name,
                           model);
    }
    if (queue.borrowing_limit_milli && *queue.borrowing_limit_milli < 0)
      return fmt::format("queue '{}': the borrowing limit must not be negative", queue.name);
    if (!(queue.weight > 0))
      return fmt::format("queue '{}': the weight must be above 0", queue.name);
  }
  return std::nullopt;
}

namespace {

// GPUs a job holds against one quota resource: all models (index 0) or one model.
struct Use {
  int32_t resource = 0;
  int64_t milli = 0;
};

using Class = std::pair<int64_t, int64_t>;

// The outcome of a quota check of one job against one resource of its queue.
struct Admission {
  bool ok = false;
  WaitReason reason = WaitReason::kOverQuota;
};

class QuotaCycle {
 public:
  QuotaCycle(Allocator& capacity, std::span<const RunningJob> running, TimeMs now,
             const SchedulerConfig& config)
      : running_(running),
        now_(now),
        config_(config),
        allocator_(capacity),
        cluster_(capacity.cluster()),
        taken_(running.size(), false) {
    BuildQuotas();
  }

  Decisions Run(std::span<const PendingJob* const> pending, const CycleOptions& options) {
    explain_ = options.explain_all_waiting;
    if (config_.backfill == Backfill::kNone && !explain_ &&
        options.pending_per_queue.size() == config_.queues.size()) {
      jobs_left_.assign(options.pending_per_queue.begin(), options.pending_per_queue.end());
      for (size_t q = 0; q < jobs_left_.size(); ++q)
        if (jobs_left_[q] <= 0) MarkQueueDone(q);
    }
    std::vector<const PendingJob*> sorted;
    if (!options.pending_sorted)
      pending = SortedByRank(
          pending, [this](const PendingJob& job) { return RankOfPending(job); }, sorted);
    if (explain_) decisions_.waiting.reserve(pending.size());
    // Strict FIFO passes over the jobs of queues that can start nothing more, without touching
    // them where the caller says which queue each job is in.
    const std::span<const int32_t> queue_hint =
        config_.backfill == Backfill::kNone && !explain_ && options.pending_sorted &&
                options.pending_queue_index.size() == pending.size()
            ? options.pending_queue_index
            : std::span<const int32_t>();
    // A job's rank is worked out only when something needs it: most jobs of a long queue are
    // passed over on their size alone.
    size_t i = 0;
    for (; i < pending.size(); ++i) {
      if (!queue_hint.empty()) {
        const int32_t q = queue_hint[i];
        if (q >= 0 && static_cast<size_t>(q) < queue_done_.size() &&
            queue_done_[static_cast<size_t>(q)]) {
          if (done_queues_ == queue_done_.size()) break;
          continue;
        }
      }
      std::optional<Rank> rank;
      if (!explain_) {
        const Pass pass = PassOver(*pending[i], rank, options);
        if (pass == Pass::kStop) break;
        if (pass == Pass::kSkip) continue;
      }
      Consider(*pending[i], rank);
    }
    decisions_.considered = static_cast<int64_t>(i);
    return std::move(decisions_);
  }

 private:
  // Indexes the queues, cohorts and quota resources, and counts what the running jobs hold.
  void BuildQuotas() {
    std::set<std::string> models;
    for (const QueueConfig& queue : config_.queues)
      for (const auto& entry : queue.guaranteed_milli_by_model)
        models.insert(entry.first);
    resource_names_.push_back("");  // resource 0: GPUs of every model
    for (const std::string& model : models) {
      model_resource_.emplace(model, static_cast<int32_t>(resource_names_.size()));
      resource_names_.push_back(model);
    }
    resources_ = resource_names_.size();
    const size_t queues = config_.queues.size();
    nominal_.assign(queues * resources_, 0);
    used_.assign(queues * resources_, 0);
    cohort_of_.assign(queues, -1);
    queue_blocked_.assign(queues, false);
    queue_done_.assign(queues, false);
    std::unordered_map<std::string_view, int32_t> cohorts;
    for (size_t q = 0; q < queues; ++q) {
      const QueueConfig& queue = config_.queues[q];
      queue_index_.emplace(queue.name, static_cast<int32_t>(q));
      if (queue.PerModel()) {
        for (const auto& [model, milli] : queue.guaranteed_milli_by_model)
          nominal_[q * resources_ + static_cast<size_t>(model_resource_.at(model))] = milli;
      } else {
        nominal_[q * resources_] = queue.guaranteed_milli;
      }
      if (queue.cohort.empty()) continue;
      auto [it, added] = cohorts.emplace(queue.cohort, static_cast<int32_t>(cohorts.size()));
      cohort_of_[q] = it->second;
      if (added) cohort_members_.emplace_back();
      cohort_members_[static_cast<size_t>(it->second)].push_back(static_cast<int32_t>(q));
    }
    cohort_nominal_.assign(cohort_members_.size() * resources_, 0);
    cohort_used_.assign(cohort_members_.size() * resources_, 0);
    for (size_t q = 0; q < queues; ++q)
      if (cohort_of_[q] >= 0)
        for (size_t r = 0; r < resources_; ++r)
          cohort_nominal_[static_cast<size_t>(cohort_of_[q]) * resources_ + r] +=
              nominal_[q * resources_ + r];

    // The resources a job of each queue may be admitted on: all models, or, for per-model
    // guarantees, each model its cohort (or the queue alone) guarantees, in name order.
    candidates_.resize(queues);
    for (size_t q = 0; q < queues; ++q) {
      if (!config_.queues[q].PerModel()) {
        candidates_[q] = {0};
        continue;
      }
      std::set<int32_t> found;
      auto add = [&](size_t member) {
        for (const auto& entry : config_.queues[member].guaranteed_milli_by_model)
          found.insert(model_resource_.at(entry.first));
      };
      if (cohort_of_[q] < 0) {
        add(q);
      } else {
        for (int32_t member : cohort_members_[static_cast<size_t>(cohort_of_[q])])
          add(static_cast<size_t>(member));
      }
      candidates_[q].assign(found.begin(), found.end());
    }

    // One pass over the running jobs, each looked at once: their queue, their quota usage and,
    // where preemption is on, their class, counted per queue for MayPreemptInQueue.
    running_queue_.assign(running_.size(), -1);
    uses_begin_.assign(running_.size() + 1, 0);
    uses_flat_.reserve(running_.size());
    const bool preemption = config_.preempt || config_.order == QueueOrder::kLas;
    if (preemption) {
      running_class_.resize(running_.size());
      victim_classes_.resize(queues);
    }
    for (size_t i = 0; i < running_.size(); ++i) {
      const RunningJob& job = running_[i];
      const int32_t q = QueueOf(job.spec);
      running_queue_[i] = q;
      if (q >= 0) {  // a queue no longer configured holds no quota
        AppendUses(q, job.spec, job.allocation, uses_flat_);
        AddUses(q, RunningUses(i, uses_flat_.size()), +1);
        if (preemption && job.spec.preemptible) CountVictim(i, q);
      }
      uses_begin_[i + 1] = static_cast<uint32_t>(uses_flat_.size());
    }
    for (std::vector<ClassMilli>& classes : victim_classes_)
      std::sort(classes.begin(), classes.end(),
                [](const ClassMilli& a, const ClassMilli& b) { return b.cls < a.cls; });
  }

  void CountVictim(size_t i, int32_t q) {
    const RunningJob& job = running_[i];
    const Class cls = RunningClassOf(job.spec, job.attained_gpu_ms, config_);
    running_class_[i] = cls;
    std::vector<ClassMilli>& classes = victim_classes_[static_cast<size_t>(q)];
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const ClassMilli& entry) { return entry.cls == cls; });
    if (it == classes.end()) it = classes.insert(classes.end(), {cls, 0, 0});
    it->milli += job.spec.TotalGpuMilli();
    ++it->jobs;
  }

  // Queue names are short: a loop beats a call to memcmp, which the profile showed.
  static bool SameName(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k)
      if (a[k] != b[k]) return false;
    return true;
  }

  int32_t QueueOf(const JobSpec& spec) const {
    // A few queues are found faster by comparing names than by hashing them.
    if (config_.queues.size() <= 16) {
      for (size_t q = 0; q < config_.queues.size(); ++q)
        if (SameName(config_.queues[q].name, spec.queue)) return static_cast<int32_t>(q);
      return -1;
    }
    auto it = queue_index_.find(spec.queue);
    return it == queue_index_.end() ? -1 : it->second;
  }

  // What an allocation holds against the quotas of queue q: per GPU model for per-model
  // guarantees (models no queue guarantees count against nothing), else all GPUs together.
  std::vector<Use> UsesOf(int32_t q, const JobSpec& spec, const Allocation& allocation) const {
    std::vector<Use> uses;
    AppendUses(q, spec, allocation, uses);
    return uses;
  }
  void AppendUses(int32_t q, const JobSpec& spec, const Allocation& allocation,
                  std::vector<Use>& out) const {
    if (spec.gpu_milli_per_task == 0) return;
    if (!config_.queues[static_cast<size_t>(q)].PerModel()) {
      out.push_back({0, static_cast<int64_t>(spec.TotalGpuMilli())});
      return;
    }
    const size_t first = out.size();
    std::vector<Use>& uses = out;
    for (const TaskPlacement& task : allocation) {
      const Node& node = cluster_.nodes[static_cast<size_t>(task.node)];
      for (const GpuShare& share : task.gpus) {
        auto it = model_resource_.find(node.gpus[static_cast<size_t>(share.gpu)].model);
        if (it == model_resource_.end()) continue;
        auto use = std::find_if(uses.begin() + static_cast<std::ptrdiff_t>(first), uses.end(),
                                [&](const Use& u) { return u.resource == it->second; });
        if (use == uses.end()) {
          uses.push_back({it->second, share.milli});
        } else {
          use->milli += share.milli;
        }
      }
    }
  }

  // The uses of running job i (`end` while its entry is being built).
  std::span<const Use> RunningUses(size_t i, size_t end = 0) const {
    const size_t begin = uses_begin_[i];
    if (end == 0) end = uses_begin_[i + 1];
    return std::span<const Use>(uses_flat_).subspan(begin, end - begin);
  }

  void AddUses(int32_t q, std::span<const Use> uses, int64_t sign) {
    reclaim_room_dirty_ = true;
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    for (const Use& use : uses) {
      used_[Index(q, use.resource)] += sign * use.milli;
      if (c >= 0)
        cohort_used_[static_cast<size_t>(c) * resources_ + static_cast<size_t>(use.resource)] +=
            sign * use.milli;
    }
  }

  size_t Index(int32_t q, int32_t r) const {
    return static_cast<size_t>(q) * resources_ + static_cast<size_t>(r);
  }
  int64_t CohortNominal(int32_t c, int32_t r) const {
    return cohort_nominal_[static_cast<size_t>(c) * resources_ + static_cast<size_t>(r)];
  }
  int64_t CohortUsed(int32_t c, int32_t r) const {
    return cohort_used_[static_cast<size_t>(c) * resources_ + static_cast<size_t>(r)];
  }

  // Kueue's admission: within the guarantee, or above it on the cohort's unused guarantee, at
  // most borrowing_limit above the guarantee. (The cohort has room exactly when its members'
  // usage plus the job stays within the sum of their guarantees.)
  Admission Admit(int32_t q, int32_t r, int64_t demand) const {
    const int64_t used = used_[Index(q, r)];
    const int64_t nominal = nominal_[Index(q, r)];
    if (used + demand <= nominal) return {true, WaitReason::kOverQuota};
    const QueueConfig& queue = config_.queues[static_cast<size_t>(q)];
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    if (c < 0) return {false, WaitReason::kOverQuota};
    if (queue.borrowing_limit_milli && used + demand - nominal > *queue.borrowing_limit_milli)
      return {false, WaitReason::kOverQuota};
    if (CohortUsed(c, r) + demand > CohortNominal(c, r))
      return {false, WaitReason::kCohortExhausted};
    return {true, WaitReason::kOverQuota};
  }

  // The most queue q could ever hold of resource r, borrowing all it may.
  int64_t MaxHold(int32_t q, int32_t r) const {
    const int64_t nominal = nominal_[Index(q, r)];
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    if (c < 0) return nominal;
    const auto& limit = config_.queues[static_cast<size_t>(q)].borrowing_limit_milli;
    const int64_t cohort = CohortNominal(c, r);
    return limit ? std::min(nominal + *limit, cohort) : cohort;
  }

  QuotaWait Detail(int32_t q, int32_t r, int64_t demand) const {
    const QueueConfig& queue = config_.queues[static_cast<size_t>(q)];
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    QuotaWait wait;
    wait.queue = queue.name;
    wait.cohort = queue.cohort;
    wait.model = resource_names_[static_cast<size_t>(r)];
    wait.used_milli = used_[Index(q, r)];
    wait.ask_milli = demand;
    wait.guaranteed_milli = nominal_[Index(q, r)];
    wait.borrowing_limit_milli = queue.borrowing_limit_milli.value_or(-1);
    if (c >= 0) wait.cohort_unused_milli = CohortNominal(c, r) - CohortUsed(c, r);
    return wait;
  }

  Rank RankOfPending(const PendingJob& job) const {
    const TimeMs since = job.last_run_end >= 0 ? job.last_run_end : job.spec.submit_time;
    return RankOf(job.spec, job.attained_gpu_ms, since, now_, config_);
  }
  const Rank& RankOfPending(const PendingJob& job, std::optional<Rank>& rank) const {
    if (!rank) rank = RankOfPending(job);
    return *rank;
  }

  enum class Pass { kConsider, kSkip, kStop };
  // Without explanations, the cheap look at a job before its queue is even looked up: kSkip
  // when Consider would pass it over all the same (no placement on the free GPUs, no reclaim, no
  // preemption, and its waiting decides nothing), kStop when that holds for every job behind it
  // too. Jobs come in rank order and, within a cycle, victims are only ever taken, so once no
  // queue has a victim of a class worse than a job's, none has one for any job behind it.
  Pass PassOver(const PendingJob& job, std::optional<Rank>& rank, const CycleOptions& options) {
    // Strict FIFO: once the head of every queue waits, nothing behind them may start.
    if (config_.backfill == Backfill::kNone)
      return done_queues_ == config_.queues.size() ? Pass::kStop : Pass::kConsider;
    if (config_.backfill == Backfill::kEasy && !reservation_) return Pass::kConsider;
    const JobSpec& spec = job.spec;
    if (spec.gpu_milli_per_task == 0 || MayPlace(spec)) return Pass::kConsider;
    if (!no_victims_left_) {
      if (MayPreemptAnywhere(RankOfPending(job, rank).cls)) return Pass::kConsider;
      no_victims_left_ = true;
    }
    // Only a reclaim is left, for a job within its own queue's room.
    const int64_t room = MaxReclaimRoom();
    if (spec.TotalGpuMilli() <= room) {
      const int32_t q = QueueOf(spec);
      return q < 0 || spec.TotalGpuMilli() <= reclaim_room_of_[static_cast<size_t>(q)]
                 ? Pass::kConsider
                 : Pass::kSkip;
    }
    // Nothing left to place on either: no GPU is free and every job left needs one.
    if (allocator_.FreeGpuMilli() == 0 && options.cpu_only_pending == 0 && room <= 0)
      return Pass::kStop;
    return Pass::kSkip;
  }

  // Whether a reclaim could be tried for the job: some resource keeps its queue within its
  // guarantee while another queue of the cohort borrows on it.
  bool MayReclaim(const JobSpec& spec, int32_t q) {
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    if (c < 0) return false;
    const int64_t demand = spec.TotalGpuMilli();
    for (int32_t r : CandidatesFor(spec, static_cast<size_t>(q))) {
      if (used_[Index(q, r)] + demand > nominal_[Index(q, r)]) continue;
      for (int32_t member : cohort_members_[static_cast<size_t>(c)])
        if (member != q && used_[Index(member, r)] > nominal_[Index(member, r)]) return true;
    }
    return false;
  }

  // The room queue q has left within its guarantee on a resource that another queue of its
  // cohort borrows (reclaim_room_of_), and the largest over all queues: MayReclaim is false for
  // every job asking for more. Recounted after usage changed, O(queues^2).
  int64_t MaxReclaimRoom() {
    if (!reclaim_room_dirty_) return reclaim_room_;
    reclaim_room_dirty_ = false;
    reclaim_room_ = 0;
    reclaim_room_of_.assign(config_.queues.size(), 0);
    for (size_t q = 0; q < config_.queues.size(); ++q) {
      const int32_t c = cohort_of_[q];
      if (c < 0) continue;
      int64_t& best = reclaim_room_of_[q];
      for (size_t r = 0; r < resources_; ++r) {
        const int32_t qi = static_cast<int32_t>(q);
        const int32_t ri = static_cast<int32_t>(r);
        const int64_t room = nominal_[Index(qi, ri)] - used_[Index(qi, ri)];
        if (room <= best) continue;
        for (int32_t member : cohort_members_[static_cast<size_t>(c)])
          if (member != qi && used_[Index(member, ri)] > nominal_[Index(member, ri)]) {
            best = room;
            break;
          }
      }
      reclaim_room_ = std::max(reclaim_room_, best);
    }
    return reclaim_room_;
  }

  // Whether TryPreemptInQueue could place a job of this rank asking for `demand`: queue q has
  // untaken preemptible jobs of a strictly worse class, and the free GPUs and theirs together
  // hold the job (Place refuses a job asking for more GPUs than are free).
  bool MayPreemptInQueue(int32_t q, const Rank& rank, int64_t demand) {
    if (!(config_.preempt || config_.order == QueueOrder::kLas)) return false;
    int64_t milli = 0;
    bool any = false;
    for (const ClassMilli& entry : victim_classes_[static_cast<size_t>(q)]) {
      if (!(rank.cls < entry.cls)) break;
      any = any || entry.jobs > 0;
      milli += entry.milli;
    }
    return any && demand <= allocator_.FreeGpuMilli() + milli;
  }

  // Whether some queue has an untaken preemptible job of a class worse than `cls`.
  bool MayPreemptAnywhere(const Class& cls) {
    if (!(config_.preempt || config_.order == QueueOrder::kLas)) return false;
    for (const std::vector<ClassMilli>& classes : victim_classes_)
      for (const ClassMilli& entry : classes) {
        if (!(cls < entry.cls)) break;
        if (entry.jobs > 0) return true;
      }
    return false;
  }

  // The resources a job may be admitted on: for per-model guarantees only the models it accepts.
  const std::vector<int32_t>& CandidatesFor(const JobSpec& spec, size_t q) {
    if (spec.gpu_milli_per_task == 0) return no_resources_;
    if (spec.gpu_models.empty() || !config_.queues[q].PerModel()) return candidates_[q];
    filtered_.clear();
    for (int32_t r : candidates_[q]) {
      const std::string& model = resource_names_[static_cast<size_t>(r)];
      if (std::find(spec.gpu_models.begin(), spec.gpu_models.end(), model) != spec.gpu_models.end())
        filtered_.push_back(r);
    }
    return filtered_;
  }

  // The spec to place for resource r: restricted to its model for a per-model guarantee.
  const JobSpec& PlacementSpec(const JobSpec& spec, int32_t r) {
    if (r == 0) return spec;
    restricted_ = spec;
    restricted_.gpu_models = {resource_names_[static_cast<size_t>(r)]};
    return restricted_;
  }

  // False when Place certainly refuses the job for want of free GPUs.
  bool MayPlace(const JobSpec& spec) const {
    if (spec.gpu_milli_per_task == 0) return true;
    if (spec.TotalGpuMilli() > allocator_.FreeGpuMilli()) return false;
    const int32_t whole = spec.WholeGpusPerTask();
    return whole == 0 || allocator_.WholeGpuTasksAtMost(whole) >= spec.tasks;
  }

  std::optional<Allocation> TryPlace(const JobSpec& spec, bool memo) {
    if (!MayPlace(spec)) return std::nullopt;
    if (memo && failed_shapes_.count(Shape{&spec}) > 0) return std::nullopt;
    auto allocation = allocator_.Place(spec, config_.placement);
    if (!allocation && memo) failed_shapes_.insert(Shape{&spec});
    return allocation;
  }

  void Consider(const PendingJob& job, std::optional<Rank>& lazy_rank) {
    const JobSpec& spec = job.spec;
    const int32_t q = QueueOf(spec);
    if (q < 0) {
      Wait(spec, WaitReason::kUnknownQueue);
      return;
    }
    const size_t qi = static_cast<size_t>(q);
    if (!jobs_left_.empty() && --jobs_left_[qi] == 0) MarkQueueDone(qi);
    // Without explanations, a job that can neither be placed on the free GPUs nor make room by
    // preempting is passed over before anything costlier, where its waiting decides nothing
    // (first fit, or EASY once the reservation is made; strict FIFO blocks its queue below).
    if (!explain_ && spec.gpu_milli_per_task > 0 &&
        (config_.backfill == Backfill::kFirstFit ||
         (config_.backfill == Backfill::kEasy && reservation_)) &&
        !MayPlace(spec) && !MayReclaim(spec, q) &&
        !MayPreemptInQueue(q, RankOfPending(job, lazy_rank), spec.TotalGpuMilli()))
      return;
    if (!explain_ && config_.backfill == Backfill::kNone && queue_blocked_[qi]) return;
    // A job that can never run never blocks the jobs behind it. Without explanations that is
    // asked only where it would (below): a job that is placed or takes victims fits.
    if (explain_) {
      if (const auto infeasible = NeverFits(spec)) {
        Wait(spec, *infeasible);
        return;
      }
    }
    const int64_t demand = spec.TotalGpuMilli();
    const std::vector<int32_t>& candidates = CandidatesFor(spec, qi);
    if (demand > 0) {
      bool ever = false;
      for (int32_t r : candidates)
        ever = ever || demand <= MaxHold(q, r);
      if (!ever) {
        QuotaWaitFor(spec, WaitReason::kInfeasibleQuota, q,
                     candidates.empty() ? std::nullopt : std::optional(candidates[0]));
        return;
      }
    }
    if (config_.backfill == Backfill::kNone && queue_blocked_[qi]) {
      Wait(spec, WaitReason::kBlockedByQueueHead);
      return;
    }
    bool uses_reserve = false;
    if (reservation_) {
      const bool ends_in_time =
          spec.runtime_estimate && now_ + *spec.runtime_estimate <= reservation_->shadow_time;
      uses_reserve = !ends_in_time;
      if (uses_reserve && demand > reservation_->spare_milli) {
        Wait(spec, WaitReason::kReservedForEarlierJob);
        return;
      }
    }

    // Admission, resource by resource (a per-model queue takes the first model with quota and
    // room, as Kueue tries flavors in order).
    std::optional<int32_t> admitted;   // first resource the quota admits
    std::optional<Admission> refusal;  // the first quota refusal
    int32_t refused_resource = 0;
    if (demand == 0) {
      if (auto allocation = TryPlace(spec, true)) {
        Start(spec, q, std::move(*allocation), uses_reserve);
        return;
      }
    }
    for (int32_t r : candidates) {
      const Admission admission = Admit(q, r, demand);
      if (!admission.ok) {
        if (!refusal) {
          refusal = admission;
          refused_resource = r;
        }
        continue;
      }
      if (!admitted) admitted = r;
      const JobSpec& placing = PlacementSpec(spec, r);
      if (auto allocation = TryPlace(placing, r == 0)) {
        Start(spec, q, std::move(*allocation), uses_reserve);
        return;
      }
    }

    // Reclaim comes first (Kueue prefers other queues' borrowed work): only for a job that stays
    // within its queue's guarantee, so a reclaim never lifts a queue above it.
    if (demand > 0 && cohort_of_[qi] >= 0) {
      for (int32_t r : candidates) {
        if (used_[Index(q, r)] + demand > nominal_[Index(q, r)]) continue;
        if (TryReclaim(spec, q, r)) return;
      }
    }
    if ((config_.preempt || config_.order == QueueOrder::kLas) &&
        TryPreemptInQueue(spec, q, RankOfPending(job, lazy_rank), candidates))
      return;

    const bool over_quota = refusal && !admitted;
    if (!explain_) {
      // Waiting decides something only where it blocks the queue (strict FIFO) or takes the
      // reservation (EASY, the first job the quota admits), and then only for a job that could
      // ever run.
      const bool decides = config_.backfill == Backfill::kNone ||
                           (config_.backfill == Backfill::kEasy && !reservation_ && !over_quota);
      if (!decides || NeverFits(spec)) return;
    }
    if (over_quota) {
      QuotaWaitFor(spec, refusal->reason, q, refused_resource);
    } else {
      // Quota admits it (or it needs none): it waits for capacity, and under EASY the first such
      // job gets the reservation.
      const JobSpec& placing = admitted ? PlacementSpec(spec, *admitted) : spec;
      Wait(spec, explain_ ? allocator_.WhyNotNow(placing) : WaitReason::kInsufficientGpus);
      if (config_.backfill == Backfill::kEasy && !reservation_) reservation_ = Reserve(spec);
    }
    if (config_.backfill == Backfill::kNone && !queue_blocked_[qi]) {
      queue_blocked_[qi] = true;
      decisions_.blocked_heads.push_back(spec.id);
      MarkQueueDone(qi);
    }
  }

  // Strict FIFO: queue q can start nothing more in this cycle (its head waits, or it has no job
  // left behind this one).
  void MarkQueueDone(size_t q) {
    if (queue_done_[q]) return;
    queue_done_[q] = true;
    ++done_queues_;
  }

  // Stops borrowed work of other queues of the cohort so that a job of queue q, within its
  // guarantee on resource r, fits: victims are preemptible running jobs of queues above their
  // guarantee on r, each taken only while its queue is still above it (see `eligible`).
  // Fewest victims first (one victim if any single one makes room), then lowest priority, then
  // least progress lost (shortest run since its start). All or nothing.
  bool TryReclaim(const JobSpec& spec, int32_t q, int32_t r) {
    const int32_t c = cohort_of_[static_cast<size_t>(q)];
    // Some queue of the cohort must be borrowing on r.
    bool borrowing = false;
    for (int32_t member : cohort_members_[static_cast<size_t>(c)])
      borrowing =
          borrowing || (member != q && used_[Index(member, r)] > nominal_[Index(member, r)]);
    if (!borrowing) return false;
    // A restricted spec is kept where it stays put: the memo below points at it.
    const JobSpec& placing_copy =
        r == 0 ? spec : restricted_store_.emplace_back(PlacementSpec(spec, r));
    // Victims depend on the queue (never its own jobs), so failures are kept per queue.
    for (const auto& [shape, resource, queue] : failed_reclaims_)
      if (resource == r && queue == q && shape == Shape{&placing_copy}) return false;
    // Victims come only from queues borrowing on r, so with one resource (every job's use is all
    // its GPUs) they free at most what those queues hold: if that and the free GPUs cannot hold
    // the job, the search below would fail.
    if (resources_ == 1) {
      int64_t bound = allocator_.FreeGpuMilli();
      for (int32_t member : cohort_members_[static_cast<size_t>(c)])
        if (member != q && used_[Index(member, 0)] > nominal_[Index(member, 0)])
          bound += used_[Index(member, 0)];
      if (bound < placing_copy.TotalGpuMilli()) {
        failed_reclaims_.emplace_back(Shape{&placing_copy}, r, q);
        return false;
      }
    }

    // Whether victim i may be taken now: it holds quota on r and its queue is borrowing on r, as
    // Kueue asks before each victim. Taking it may leave that queue below its guarantee (the
    // borrower bears the granularity of its own jobs), but a queue within its guarantee never
    // loses a job to a reclaim.
    auto eligible = [&](size_t i) {
      const int32_t vq = running_queue_[i];
      if (used_[Index(vq, r)] <= nominal_[Index(vq, r)]) return false;
      for (const Use& use : RunningUses(i))
        if (use.resource == r && use.milli > 0) return true;
      return false;
    };
    std::vector<size_t> order;
    int64_t reachable = allocator_.FreeGpuMilli();
    for (size_t i = 0; i < running_.size(); ++i) {
      const int32_t vq = running_queue_[i];
      if (vq < 0 || vq == q || cohort_of_[static_cast<size_t>(vq)] != c) continue;
      if (!running_[i].spec.preemptible || taken_[i] || !eligible(i)) continue;
      order.push_back(i);
      reachable += running_[i].spec.TotalGpuMilli();
    }
    if (reachable < placing_copy.TotalGpuMilli()) {
      failed_reclaims_.emplace_back(Shape{&placing_copy}, r, q);
      return false;
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const RunningJob& x = running_[a];
      const RunningJob& y = running_[b];
      if (x.spec.priority != y.spec.priority) return x.spec.priority < y.spec.priority;
      if (x.start_time != y.start_time) return x.start_time > y.start_time;  // least progress
      return x.spec.id < y.spec.id;
    });
    auto release = [&](size_t i) {
      allocator_.Release(running_[i].spec, running_[i].allocation);
      AddUses(running_queue_[i], RunningUses(i), -1);
    };
    auto restore = [&](size_t i) {
      allocator_.Commit(running_[i].spec, running_[i].allocation);
      AddUses(running_queue_[i], RunningUses(i), +1);
    };
    auto place = [&]() -> std::optional<Allocation> {
      if (!MayPlace(placing_copy)) return std::nullopt;
      return allocator_.Place(placing_copy, config_.placement);
    };

    // One victim, if any single one makes room.
    for (size_t i : order) {
      if (!eligible(i)) continue;
      if (allocator_.FreeGpuMilli() + running_[i].spec.TotalGpuMilli() <
          placing_copy.TotalGpuMilli())
        continue;
      release(i);
      if (auto allocation = place()) {
        Preempted(i, spec.id, PreemptReason::kReclaim);
        Start(spec, q, std::move(*allocation), false, true);
        return true;
      }
      restore(i);
    }
    // Otherwise in order until it fits, then give back the victims it turns out not to need.
    std::vector<size_t> released;
    std::optional<Allocation> allocation;
    for (size_t i : order) {
      if (!eligible(i)) continue;
      release(i);
      released.push_back(i);
      if ((allocation = place())) break;
    }
    if (!allocation) {
      for (size_t i : released)
        restore(i);
      failed_reclaims_.emplace_back(Shape{&placing_copy}, r, q);
      return false;
    }
    std::vector<size_t> needed = GiveBack(released, placing_copy, *allocation, [] { return true; });
    for (size_t i : needed)
      Preempted(i, spec.id, PreemptReason::kReclaim);
    Start(spec, q, std::move(*allocation), false, true);
    return true;
  }

  // Gives back released victims the placement does not need, the last released kept; `admits`
  // says whether the quota still admits the job with a victim back. Returns the victims kept.
  template <typename Admits>
  std::vector<size_t> GiveBack(const std::vector<size_t>& released, const JobSpec& placing,
                               Allocation& allocation, Admits&& admits) {
    std::vector<size_t> needed;
    for (auto it = released.rbegin(); it != released.rend(); ++it) {
      const size_t i = *it;
      if (it == released.rbegin()) {
        needed.push_back(i);
        continue;
      }
      allocator_.Release(placing, allocation);
      allocator_.Commit(running_[i].spec, running_[i].allocation);
      AddUses(running_queue_[i], RunningUses(i), +1);
      std::optional<Allocation> without;
      if (admits()) without = allocator_.Place(placing, config_.placement);
      if (without) {
        allocation = std::move(*without);
      } else {
        allocator_.Release(running_[i].spec, running_[i].allocation);
        AddUses(running_queue_[i], RunningUses(i), -1);
        allocation = *allocator_.Place(placing, config_.placement);
        needed.push_back(i);
      }
    }
    std::sort(needed.begin(), needed.end(),
              [&](size_t a, size_t b) { return running_[a].spec.id < running_[b].spec.id; });
    return needed;
  }

  // Priority preemption inside queue q: preemptible running jobs of q of a strictly worse class
  // (lower priority; for LAS also a later LAS queue), worst first and among equals the most
  // recently started. Stopping them frees GPUs and the queue's own quota. All or nothing.
  bool TryPreemptInQueue(const JobSpec& spec, int32_t q, const Rank& rank,
                         const std::vector<int32_t>& candidates) {
    for (const auto& [shape_spec, cls] : failed_in_queue_)
      if (cls == rank.cls && shape_spec.queue == spec.queue && Shape{&shape_spec} == Shape{&spec})
        return false;
    std::vector<std::pair<Class, size_t>> victims;
    for (size_t i = 0; i < running_.size(); ++i) {
      if (running_queue_[i] != q || taken_[i] || !running_[i].spec.preemptible) continue;
      const Class cls = RunningClass(i);
      if (rank.cls < cls) victims.emplace_back(cls, i);
    }
    if (victims.empty()) {
      failed_in_queue_.emplace_back(spec, rank.cls);
      return false;
    }
    std::sort(victims.begin(), victims.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return b.first < a.first;
      const RunningJob& x = running_[a.second];
      const RunningJob& y = running_[b.second];
      if (x.start_time != y.start_time) return x.start_time > y.start_time;
      return x.spec.id > y.spec.id;
    });
    const int64_t demand = spec.TotalGpuMilli();
    std::vector<size_t> released;
    std::optional<Allocation> allocation;
    int32_t resource = 0;
    // Restricted copies of the spec, one per per-model resource, made once.
    std::vector<std::pair<int32_t, JobSpec>> restricted;
    for (int32_t r : candidates)
      if (r != 0) restricted.emplace_back(r, PlacementSpec(spec, r));
    auto spec_for = [&](int32_t r) -> const JobSpec& {
      for (const auto& entry : restricted)
        if (entry.first == r) return entry.second;
      return spec;
    };
    for (const auto& victim : victims) {
      const size_t i = victim.second;
      allocator_.Release(running_[i].spec, running_[i].allocation);
      AddUses(q, RunningUses(i), -1);
      released.push_back(i);
      for (int32_t r : demand > 0 ? candidates : cpu_only_) {
        if ((demand > 0 && !Admit(q, r, demand).ok) || !MayPlace(spec_for(r))) continue;
        if ((allocation = allocator_.Place(spec_for(r), config_.placement))) {
          resource = r;
          break;
        }
      }
      if (allocation) break;
    }
    const JobSpec& placing = spec_for(resource);
    if (!allocation) {
      for (size_t i : released) {
        allocator_.Commit(running_[i].spec, running_[i].allocation);
        AddUses(q, RunningUses(i), +1);
      }
      failed_in_queue_.emplace_back(spec, rank.cls);
      return false;
    }
    std::vector<size_t> needed = GiveBack(released, placing, *allocation, [&] {
      return demand == 0 || Admit(q, resource, demand).ok;
    });
    for (size_t i : needed) {
      const bool demoted =
          config_.order == QueueOrder::kLas && RunningClass(i).first == rank.cls.first;
      Preempted(i, spec.id, demoted ? PreemptReason::kLasDemotion : PreemptReason::kHigherPriority);
    }
    Start(spec, q, std::move(*allocation), false, true);
    return true;
  }

  // The class of preemptible running job i.
  Class RunningClass(size_t i) const { return running_class_[i]; }

  // Records victim i as preempted; its allocation and usage are already released.
  void Preempted(size_t i, JobId for_job, PreemptReason reason) {
    taken_[i] = true;
    if (!victim_classes_.empty()) {
      for (ClassMilli& entry : victim_classes_[static_cast<size_t>(running_queue_[i])])
        if (entry.cls == running_class_[i]) {
          entry.milli -= running_[i].spec.TotalGpuMilli();
          --entry.jobs;
        }
    }
    decisions_.preemptions.push_back({running_[i].spec.id, for_job, reason});
  }

  // `after_preemption`: capacity grew, so shapes that failed before may fit now.
  void Start(const JobSpec& spec, int32_t q, Allocation allocation, bool uses_reserve,
             bool after_preemption = false) {
    if (after_preemption) {
      failed_shapes_.clear();
      failed_reclaims_.clear();
      failed_in_queue_.clear();
    }
    if (uses_reserve) reservation_->spare_milli -= spec.TotalGpuMilli();
    AddUses(q, UsesOf(q, spec, allocation), +1);
    if (spec.runtime_estimate)
      new_ends_.emplace_back(now_ + *spec.runtime_estimate, spec.TotalGpuMilli());
    decisions_.placements.push_back({spec.id, std::move(allocation)});
  }

  void Wait(const JobSpec& spec, WaitReason reason) {
    if (explain_) decisions_.waiting.push_back({spec.id, reason, std::nullopt});
  }
  // A quota wait; its numbers are gathered only when someone will read them.
  void QuotaWaitFor(const JobSpec& spec, WaitReason reason, int32_t q,
                    std::optional<int32_t> resource) {
    if (!explain_) return;
    std::optional<QuotaWait> detail;
    if (resource) detail = Detail(q, *resource, spec.TotalGpuMilli());
    decisions_.waiting.push_back({spec.id, reason, std::move(detail)});
  }

  std::optional<WaitReason> NeverFits(const JobSpec& spec) {
    const Shape shape{&spec};
    auto it = infeasible_shapes_.find(shape);
    if (it != infeasible_shapes_.end()) return it->second;
    return infeasible_shapes_.emplace(shape, allocator_.WhyNeverFits(spec)).first->second;
  }

  // EASY backfill's reservation, as in the plain cycle: over the whole cluster, for the first
  // job that the quota admits but the free GPUs cannot hold.
  Reservation Reserve(const JobSpec& head) const {
    return ReserveForHead(
        head, new_ends_, running_, [this](size_t i) { return taken_[i]; }, now_,
        allocator_.FreeGpuMilli());
  }

  std::span<const RunningJob> running_;
  TimeMs now_;
  const SchedulerConfig& config_;
  Allocator& allocator_;
  const Cluster& cluster_;
  bool explain_ = true;
  Decisions decisions_;

  std::unordered_map<std::string_view, int32_t> queue_index_;
  std::unordered_map<std::string, int32_t> model_resource_;
  std::vector<std::string> resource_names_;
  size_t resources_ = 1;
  std::vector<int64_t> nominal_, used_;  // [queue][resource]
  std::vector<int32_t> cohort_of_;       // -1: none
  std::vector<std::vector<int32_t>> cohort_members_;
  std::vector<int64_t> cohort_nominal_, cohort_used_;  // [cohort][resource]
  std::vector<std::vector<int32_t>> candidates_;       // per queue
  const std::vector<int32_t> no_resources_;
  const std::vector<int32_t> cpu_only_ = {0};  // a CPU-only job's one pseudo-resource

  std::vector<int32_t> running_queue_;
  std::vector<Use> uses_flat_;        // what the running jobs hold, job after job
  std::vector<uint32_t> uses_begin_;  // job i's uses: [uses_begin_[i], uses_begin_[i + 1])
  std::vector<bool> taken_;           // preempted in this cycle
  JobSpec restricted_;
  std::vector<int32_t> filtered_;
  // Preemption classes of the preemptible running jobs, and per queue the untaken ones' GPUs by
  // class, worst first; empty when preemption is off.
  struct ClassMilli {
    Class cls;
    int64_t milli = 0;
    int32_t jobs = 0;
  };
  std::vector<Class> running_class_;
  std::vector<std::vector<ClassMilli>> victim_classes_;
  bool no_victims_left_ = false;  // no job from here on may preempt (PassOver)
  bool reclaim_room_dirty_ = true;
  int64_t reclaim_room_ = 0;  // see MaxReclaimRoom
  std::vector<int64_t> reclaim_room_of_;

  std::unordered_set<Shape, ShapeHash> failed_shapes_;
  std::unordered_map<Shape, std::optional<WaitReason>, ShapeHash> infeasible_shapes_;
  std::vector<std::tuple<Shape, int32_t, int32_t>> failed_reclaims_;  // shape, resource, queue
  std::deque<JobSpec> restricted_store_;
  std::vector<std::pair<JobSpec, Class>> failed_in_queue_;
  std::vector<bool> queue_blocked_;  // strict FIFO: queues whose head waits
  std::vector<bool> queue_done_;     // strict FIFO: blocked, or no job of theirs left
  size_t done_queues_ = 0;
  std::vector<int64_t> jobs_left_;  // per queue, from CycleOptions::pending_per_queue
  std::vector<std::pair<TimeMs, int64_t>> new_ends_;
  std::optional<Reservation> reservation_;
};

}  // namespace

Decisions RunQuotaCycle(Allocator& capacity, std::span<const RunningJob> running,
                        std::span<const PendingJob* const> pending, TimeMs now,
                        const SchedulerConfig& config, const CycleOptions& options) {
  return QuotaCycle(capacity, running, now, config).Run(pending, options);
}

}  // namespace gpufleet::sched
