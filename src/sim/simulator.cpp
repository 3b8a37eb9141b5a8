#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "sched/allocator.h"
#include "sched/fair_share.h"
#include "sched/scheduler.h"

namespace gpufleet::sim {
namespace {

constexpr size_t kMaxSkipExamples = 5;

MilliGpu AllocatedMilli(const sched::Allocation& allocation) {
  MilliGpu total = 0;
  for (const sched::TaskPlacement& task : allocation) {
    for (const sched::GpuShare& share : task.gpus)
      total += share.milli;
  }
  return total;
}

// GPU-milliseconds of service for `milli` milli-GPUs held for `elapsed` ms.
int64_t ServiceGpuMs(MilliGpu milli, TimeMs elapsed) {
  return static_cast<int64_t>(milli) * elapsed / kMilliPerGpu;
}

// Event-driven replay. Arrivals come straight from the sorted trace; only completions and LAS
// demotion checks go through the heap, so the heap holds at most two events per running job
// (plus stale ones, skipped by their generation).
class Replay {
 public:
  Replay(const Cluster& cluster, const Trace& trace, const sched::SchedulerConfig& config,
         const SimOptions& options)
      : cluster_(cluster), trace_(trace), config_(config), options_(options), capacity_(cluster) {}

  SimResult Run() {
    const size_t n = trace_.jobs.size();
    result_.mode = SimMode::kReplay;
    result_.usable_gpus = cluster_.UsableGpus();
    result_.jobs_total = static_cast<int64_t>(n);
    result_.jobs.resize(n);
    jobs_.resize(n);
    if (n == 0) return std::move(result_);
    pending_jobs_.resize(n);  // never reallocated: the queue points into it
    queue_.reserve(std::min<size_t>(n, size_t{1} << 16));
    queued_queue_index_.reserve(queue_.capacity());
    // Only LAS with a starvation factor reorders jobs while they wait; otherwise the queue is
    // kept in the scheduler's order and the cycle need not sort it.
    // Fair share reorders queues as their usage decays and grows.
    // Only LAS with a starvation factor reorders jobs while they wait for good; fair share
    // reorders queues as their usage changes, and the queue is re-sorted when it does.
    keep_sorted_ = !(config_.order == sched::QueueOrder::kLas && config_.las_starvation_factor > 0);
    if (config_.order == sched::QueueOrder::kFairShare)
      fair_share_.emplace(config_.fair_share_half_life_s);
    // Team queues: each job's queue, for the per-queue report. A job of a queue not configured
    // is an error here (the scheduler would keep it waiting forever).
    std::unordered_map<std::string_view, int32_t> queue_index;
    for (const sched::QueueConfig& queue : config_.queues) {
      queue_index.emplace(queue.name, static_cast<int32_t>(result_.queue_names.size()));
      result_.queue_names.push_back(queue.name);
    }
    // Fair share without configured queues shares between the queues the jobs name: report
    // those, in name order.
    const bool queues_from_trace =
        config_.queues.empty() && config_.order == sched::QueueOrder::kFairShare;
    if (queues_from_trace) {
      std::set<std::string_view> names;
      for (const TraceJob& job : trace_.jobs)
        names.insert(job.spec.queue);
      for (std::string_view name : names) {
        queue_index.emplace(name, static_cast<int32_t>(result_.queue_names.size()));
        result_.queue_names.emplace_back(name);
      }
    }
    result_.queue_bucket_ms = kFirstQueueBucketMs;
    result_.queue_gpu_milli_ms.assign(result_.queue_names.size(), 0.0);
    reclaim_possible_ = std::any_of(config_.queues.begin(), config_.queues.end(),
                                    [](const sched::QueueConfig& q) { return !q.cohort.empty(); });
    queue_allocated_milli_.assign(result_.queue_names.size(), 0);
    pending_per_queue_.assign(config_.queues.size(), 0);
    for (size_t i = 0; i < n; ++i) {
      const TraceJob& job = trace_.jobs[i];
      if (!queue_index.empty()) {
        auto it = queue_index.find(job.spec.queue);
        if (it == queue_index.end())
          throw SimError(fmt::format("{}:{}: job names queue '{}', which is not configured",
                                     trace_.source, job.line, job.spec.queue));
        result_.jobs[i].queue = it->second;
      }
      if (i > 0 && job.spec.submit_time < trace_.jobs[i - 1].spec.submit_time)
        throw SimError(
            fmt::format("{}:{}: the trace is not sorted by submit time", trace_.source, job.line));
      if (job.duration < 0)
        throw SimError(fmt::format("{}:{}: negative duration", trace_.source, job.line));
      jobs_[i].remaining = job.duration;
      result_.jobs[i].submit_time = job.spec.submit_time;
    }
    result_.first_submit = trace_.jobs.front().spec.submit_time;
    usable_gpu_milli_ = result_.usable_gpus * kMilliPerGpu;
    last_time_ = result_.first_submit;

    size_t next_arrival = 0;
    while (next_arrival < n || !events_.empty()) {
      TimeMs now = next_arrival < n ? trace_.jobs[next_arrival].spec.submit_time : kNever;
      if (!events_.empty()) now = std::min(now, events_.top().time);
      AdvanceTo(now);

      bool changed = false;
      // Completions (and demotion checks) first, so that arrivals at the same instant see the
      // freed GPUs.
      while (!events_.empty() && events_.top().time == now) {
        const Event event = events_.top();
        events_.pop();
        JobState& state = jobs_[event.job];
        if (state.where != Where::kRunning || state.generation != event.generation) continue;
        if (event.kind == EventKind::kCompletion) {
          Finish(event.job, now);
        } else {
          PushDemotionCheck(event.job, now);
        }
        changed = true;
      }
      if (changed) settled_ = false;
      bool arrivals_blocked = true;  // every arrival waits behind its queue's blocked head
      while (next_arrival < n && trace_.jobs[next_arrival].spec.submit_time == now) {
        Arrive(next_arrival, now);
        arrivals_blocked = arrivals_blocked && WaitsBehindBlockedHead(next_arrival, now);
        ++next_arrival;
        changed = true;
      }
      if (!changed || PendingCount() == 0 || NothingCanStart() || (settled_ && arrivals_blocked)) {
        // Still record the state change (a completion, or arrivals that must wait).
        if (changed) Record(now);
        continue;
      }
      Cycle(now);
      Record(now);
    }
    if (PendingCount() > 0) {
      const sched::Waiting stuck = ExplainFirstWaiting();
      throw SimError(fmt::format(
          "no progress possible at t={} s: {} job(s) pending, nothing running and no arrivals "
          "left; {} waits because: {}",
          last_time_ / kMsPerSecond, PendingCount(), DescribeJob(stuck.job),
          sched::DescribeWait(stuck, trace_.jobs[stuck.job].spec)));
    }
    result_.time_series = Downsample(series_, result_.last_finish, options_.max_time_series_points);
    return std::move(result_);
  }

 private:
  static constexpr TimeMs kNever = std::numeric_limits<TimeMs>::max();

  enum class Where : uint8_t { kNotArrived, kPending, kRunning, kDone };
  // Completions sort before demotion checks at the same instant.
  enum class EventKind : uint8_t { kCompletion = 0, kDemotionCheck = 1 };

  struct JobState {
    TimeMs remaining = 0;        // run time still needed as of the current run's start
    int64_t earlier_gpu_ms = 0;  // service from runs before the current one
    MilliGpu milli = 0;          // GPU share held while running
    int32_t slot = -1;           // position in queue_ (absolute) or running_
    uint32_t generation = 0;     // bumped on every stop; invalidates queued events
    Where where = Where::kNotArrived;
  };

  struct Event {
    TimeMs time = 0;
    EventKind kind = EventKind::kCompletion;
    uint32_t generation = 0;
    size_t job = 0;
    bool operator>(const Event& other) const {
      if (time != other.time) return time > other.time;
      if (kind != other.kind) return kind > other.kind;
      return job > other.job;
    }
  };

  std::string DescribeJob(JobId index) const {
    const TraceJob& job = trace_.jobs[index];
    return fmt::format("line {} ({})", job.line, job.trace_id.empty() ? "no id" : job.trace_id);
  }

  void AdvanceTo(TimeMs now) {
    result_.allocated_gpu_milli_ms +=
        static_cast<double>(allocated_milli_) * static_cast<double>(now - last_time_);
    for (size_t q = 0; q < queue_allocated_milli_.size(); ++q)
      result_.queue_gpu_milli_ms[q] +=
          static_cast<double>(queue_allocated_milli_[q]) * static_cast<double>(now - last_time_);
    if (!queue_allocated_milli_.empty()) AddToQueueBuckets(last_time_, now);
    last_time_ = now;
  }

  // Spreads the queues' allocations over [from, to) on the time buckets, doubling the bucket
  // width (merging neighbours) when `to` lies beyond the last bucket there may be.
  void AddToQueueBuckets(TimeMs from, TimeMs to) {
    auto& buckets = result_.queue_bucket_gpu_milli_ms;
    const TimeMs origin = result_.first_submit;
    while ((to - 1 - origin) / result_.queue_bucket_ms >= static_cast<TimeMs>(kMaxBuckets)) {
      for (size_t b = 0; b < buckets.size(); ++b) {
        std::vector<double>& merged = buckets[b / 2];
        if (b % 2 == 0) {
          if (b > 0) merged = std::move(buckets[b]);
        } else {
          for (size_t q = 0; q < merged.size(); ++q)
            merged[q] += buckets[b][q];
        }
      }
      buckets.resize((buckets.size() + 1) / 2);
      result_.queue_bucket_ms *= 2;
    }
    const TimeMs width = result_.queue_bucket_ms;
    for (TimeMs at = from; at < to;) {
      const auto bucket = static_cast<size_t>((at - origin) / width);
      const TimeMs bucket_end = origin + static_cast<TimeMs>(bucket + 1) * width;
      const TimeMs until = std::min(to, bucket_end);
      if (buckets.size() <= bucket)
        buckets.resize(bucket + 1, std::vector<double>(queue_allocated_milli_.size(), 0.0));
      for (size_t q = 0; q < queue_allocated_milli_.size(); ++q)
        buckets[bucket][q] +=
            static_cast<double>(queue_allocated_milli_[q]) * static_cast<double>(until - at);
      at = until;
    }
  }

  void Arrive(size_t index, TimeMs now) {
    const TraceJob& job = trace_.jobs[index];
    sched::PendingJob& pending = pending_jobs_[index];
    pending.spec = job.spec;
    pending.spec.id = index;  // dense ids: the scheduler's answers index jobs_ directly
    if (options_.estimates == Estimates::kOracle) pending.spec.runtime_estimate = job.duration;
    Enqueue(index, now);
  }

  void Finish(size_t index, TimeMs now) {
    JobState& state = jobs_[index];
    const sched::RunningJob& running = running_[static_cast<size_t>(state.slot)];
    capacity_.Release(running.spec, running.allocation);
    RemoveRunning(index, now);
    allocated_milli_ -= state.milli;
    AddQueueMilli(index, -state.milli);
    state.milli = 0;
    state.where = Where::kDone;
    ++state.generation;
    result_.jobs[index].finish = now;
    result_.last_finish = std::max(result_.last_finish, now);
  }

  void AddQueueMilli(size_t index, int64_t milli) {
    const int32_t q = result_.jobs[index].queue;
    if (q >= 0) queue_allocated_milli_[static_cast<size_t>(q)] += milli;
  }

  // Counted for configured queues only, as CycleOptions::pending_per_queue asks.
  void AddPendingInQueue(size_t index, int64_t count) {
    const int32_t q = result_.jobs[index].queue;
    if (q >= 0 && static_cast<size_t>(q) < pending_per_queue_.size())
      pending_per_queue_[static_cast<size_t>(q)] += count;
  }

  // Under fair share every job has a queue: a configured one, or one the trace names.
  const std::string& FairShareQueue(size_t index) const {
    return result_.queue_names[static_cast<size_t>(result_.jobs[index].queue)];
  }

  // `now`: when the job stopped holding its GPUs.
  void RemoveRunning(size_t index, TimeMs now) {
    const int32_t slot = jobs_[index].slot;
    if (fair_share_) {
      // Named from the report, not the running spec: Preempt has moved that out already.
      fair_share_->Close(FairShareQueue(index),
                         static_cast<double>(jobs_[index].milli) / kMilliPerGpu,
                         running_[static_cast<size_t>(slot)].start_time, now);
    }
    if (static_cast<size_t>(slot) + 1 != running_.size()) {
      running_[slot] = std::move(running_.back());
      running_service_[slot] = running_service_.back();
      jobs_[running_[slot].spec.id].slot = slot;
    }
    running_.pop_back();
    running_service_.pop_back();
    jobs_[index].slot = -1;
  }

  void Cycle(TimeMs now) {
    for (size_t i = 0; i < running_.size(); ++i) {
      const RunningService& service = running_service_[i];
      running_[i].attained_gpu_ms =
          service.earlier_gpu_ms + ServiceGpuMs(service.milli, now - running_[i].start_time);
    }
    if (fair_share_) UpdateFairShare(now);
    const auto running = std::span<const sched::RunningJob>(running_);
    const auto pending = std::span<const sched::PendingJob* const>(queue_).subspan(queue_head_);
    sched::Decisions decisions;
    if (options_.cycle_hints) {
      // No wait reasons (the run asks for them only if it gets stuck), and the cycle works on
      // capacity_ itself, leaving its decisions applied, instead of on a copy.
      sched::CycleOptions hints;
      hints.pending_sorted = keep_sorted_;
      hints.cpu_only_pending = cpu_only_pending_;
      hints.pending_per_queue = pending_per_queue_;
      if (!config_.queues.empty())
        hints.pending_queue_index =
            std::span<const int32_t>(queued_queue_index_).subspan(queue_head_);
      hints.explain_all_waiting = false;
      decisions = sched::ScheduleInPlace(capacity_, running, pending, now, config_, hints);
      applied_ = true;
      Settle(decisions);
    } else {
      // The reference path: a full cycle on a copy, whose decisions Preempt and Start apply.
      decisions = sched::Schedule(capacity_, running, pending, now, config_, sched::CycleOptions{});
      applied_ = false;
    }
    ++result_.scheduling_cycles;
    // GPUs the victims hold through their grace period: (node, GPU) pairs.
    std::vector<std::pair<int32_t, int32_t>> draining;
    if (options_.grace_period_ms > 0) {
      for (const sched::Preemption& preemption : decisions.preemptions) {
        if (preemption.job >= jobs_.size() || jobs_[preemption.job].where != Where::kRunning)
          continue;  // Preempt reports it
        for (const sched::TaskPlacement& task : running_[jobs_[preemption.job].slot].allocation)
          for (const sched::GpuShare& share : task.gpus)
            draining.emplace_back(task.node, share.gpu);
      }
      std::sort(draining.begin(), draining.end());
    }
    for (const sched::Preemption& preemption : decisions.preemptions)
      Preempt(preemption.job, now);
    for (sched::Placement& placement : decisions.placements) {
      bool waits_for_grace = false;
      for (const sched::TaskPlacement& task : placement.allocation)
        for (const sched::GpuShare& share : task.gpus)
          waits_for_grace = waits_for_grace || std::binary_search(draining.begin(), draining.end(),
                                                                  std::pair(task.node, share.gpu));
      Start(placement, now, waits_for_grace ? options_.grace_period_ms : 0);
    }
    if (!holes_.empty()) CompactPending();
  }

  void UpdateFairShare(TimeMs now) {
    config_.fair_share_factor = sched::FairShareFactors(fair_share_->UsageAt(now), config_.queues);
    // Jobs of two queues compare by their factors alone (then by submit time), so the kept order
    // stays valid while the order of the queues' factors, ties included, stays the same: re-sort
    // only when it changes, not on every cycle.
    std::vector<std::pair<double, int32_t>> by_factor;
    for (size_t q = 0; q < result_.queue_names.size(); ++q) {
      const auto it = config_.fair_share_factor.find(result_.queue_names[q]);
      const double factor = it == config_.fair_share_factor.end() ? 1.0 : it->second;
      by_factor.emplace_back(-static_cast<double>(std::llround(factor * 1e12)),
                             static_cast<int32_t>(q));
    }
    std::sort(by_factor.begin(), by_factor.end());
    std::vector<int32_t> ranks(by_factor.size());
    int32_t rank = 0;
    for (size_t i = 0; i < by_factor.size(); ++i) {
      if (i > 0 && by_factor[i].first != by_factor[i - 1].first) ++rank;
      ranks[static_cast<size_t>(by_factor[i].second)] = rank;
    }
    if (ranks == fair_share_ranks_) return;
    fair_share_ranks_ = std::move(ranks);
    if (!keep_sorted_) return;
    auto live = queue_.begin() + static_cast<ptrdiff_t>(queue_head_);
    std::stable_sort(live, queue_.end(),
                     [&](const sched::PendingJob* a, const sched::PendingJob* b) {
                       return sched::PendingBefore(*a, *b, now, config_);
                     });
    for (size_t i = queue_head_; i < queue_.size(); ++i) {
      jobs_[queue_[i]->spec.id].slot = static_cast<int32_t>(i);
      queued_queue_index_[i] = result_.jobs[queue_[i]->spec.id].queue;
    }
  }

  // Why the first job that waits does so, by a cycle with full explanations on the present
  // state. Only for the message of a run that cannot go on.
  sched::Waiting ExplainFirstWaiting() {
    const sched::Decisions decisions =
        sched::Schedule(capacity_, std::span<const sched::RunningJob>(running_),
                        std::span<const sched::PendingJob* const>(queue_).subspan(queue_head_),
                        last_time_, config_, sched::CycleOptions{});
    if (!decisions.waiting.empty()) return decisions.waiting.front();
    return {.job = queue_[queue_head_]->spec.id,
            .reason = sched::WaitReason::kInsufficientGpus,
            .quota = std::nullopt};
  }

  void Preempt(JobId id, TimeMs now) {
    if (id >= jobs_.size() || jobs_[id].where != Where::kRunning)
      throw SimError(fmt::format("the scheduler preempted job {} which is not running", id));
    JobState& state = jobs_[id];
    sched::RunningJob& running = running_[state.slot];
    const TimeMs ran = now - running.start_time;
    if (!applied_) capacity_.Release(running.spec, running.allocation);
    sched::PendingJob& pending = pending_jobs_[id];
    pending.spec = std::move(running.spec);
    pending.attained_gpu_ms = state.earlier_gpu_ms + ServiceGpuMs(state.milli, ran);
    pending.last_run_end = now;
    pending.preemptions = ++result_.jobs[id].preemptions;
    RemoveRunning(id, now);

    state.earlier_gpu_ms = pending.attained_gpu_ms;
    state.remaining = std::max<TimeMs>(0, state.remaining - ran) + options_.restart_cost_ms;
    allocated_milli_ -= state.milli;
    AddQueueMilli(id, -state.milli);
    state.milli = 0;
    ++state.generation;
    Enqueue(id, now);
    ++result_.preemptions;
  }

  // `delay`: the job's GPUs are still held by a preempted job's grace period for this long.
  void Start(sched::Placement& placement, TimeMs now, TimeMs delay = 0) {
    const JobId id = placement.job;
    if (id >= jobs_.size() || jobs_[id].where != Where::kPending)
      throw SimError(fmt::format("the scheduler placed job {} which is not pending", id));
    JobState& state = jobs_[id];
    sched::PendingJob& pending = pending_jobs_[id];
    holes_.push_back(state.slot);
    if (pending.spec.gpu_milli_per_task == 0) --cpu_only_pending_;
    AddPendingInQueue(id, -1);
    sched::RunningJob running;
    running.spec = std::move(pending.spec);
    running.allocation = std::move(placement.allocation);
    running.start_time = now;
    running.attained_gpu_ms = state.earlier_gpu_ms;
    // Commit checks the placement against what runs: a scheduler bug would throw here. (The
    // property tests check that ScheduleInPlace leaves the same capacity.)
    if (!applied_) capacity_.Commit(running.spec, running.allocation);
    state.milli = AllocatedMilli(running.allocation);
    allocated_milli_ += state.milli;
    AddQueueMilli(id, state.milli);
    state.where = Where::kRunning;
    if (fair_share_)
      fair_share_->Open(FairShareQueue(id), static_cast<double>(state.milli) / kMilliPerGpu, now);
    state.slot = static_cast<int32_t>(running_.size());
    running_.push_back(std::move(running));
    running_service_.push_back({.earlier_gpu_ms = state.earlier_gpu_ms, .milli = state.milli});

    JobOutcome& outcome = result_.jobs[id];
    if (outcome.first_start < 0) outcome.first_start = now;
    state.remaining += delay;
    events_.push(Event{.time = now + state.remaining,
                       .kind = EventKind::kCompletion,
                       .generation = state.generation,
                       .job = id});
    PushDemotionCheck(id, now);
  }

  // Under LAS a running job's queue changes when its service passes a limit, which may let a
  // pending job preempt it: schedule a cycle for the first millisecond past the next limit.
  void PushDemotionCheck(size_t index, TimeMs now) {
    if (config_.order != sched::QueueOrder::kLas) return;
    const JobState& state = jobs_[index];
    if (state.milli <= 0) return;
    const sched::RunningJob& running = running_[state.slot];
    const int64_t service =
        state.earlier_gpu_ms + ServiceGpuMs(state.milli, now - running.start_time);
    int64_t next_limit = -1;
    for (int64_t limit_s : config_.las_queue_limits_gpu_s) {
      const int64_t limit = limit_s * kMsPerSecond;
      if (limit >= service && (next_limit < 0 || limit < next_limit)) next_limit = limit;
    }
    if (next_limit < 0) return;
    // Smallest run time t with earlier + floor(milli * t / 1000) > limit.
    const int64_t needed = (next_limit - state.earlier_gpu_ms + 1) * kMilliPerGpu;
    const TimeMs run_time = (needed + state.milli - 1) / state.milli;
    const TimeMs when = running.start_time + run_time;
    // Past the completion the check is moot.
    if (when >= running.start_time + state.remaining) return;
    events_.push(Event{.time = std::max(when, now + 1),
                       .kind = EventKind::kDemotionCheck,
                       .generation = state.generation,
                       .job = index});
  }

  size_t PendingCount() const { return queue_.size() - queue_head_; }

  // Strict FIFO with team queues and no preemption but reclaim: after a cycle that decided
  // nothing, the same cycle decides nothing again until something but an arrival changes, or an
  // arrival ranks ahead of its queue's blocked head or joins a queue without one. (Capacity and
  // usage are what that cycle saw throughout, so each head waits again whatever the order; fair
  // share's factors order queues only.) The run then skips the cycle; the reference path
  // (cycle_hints off) runs every one, and the tests compare the two.
  void Settle(const sched::Decisions& decisions) {
    settled_ = !config_.queues.empty() && config_.backfill == sched::Backfill::kNone &&
               !config_.preempt && config_.order != sched::QueueOrder::kLas &&
               decisions.placements.empty() && decisions.preemptions.empty();
    if (!settled_) return;
    blocked_head_.assign(config_.queues.size(), kNoJob);
    for (const JobId head : decisions.blocked_heads) {
      const int32_t q = result_.jobs[head].queue;
      if (q >= 0) blocked_head_[static_cast<size_t>(q)] = head;
    }
  }

  bool WaitsBehindBlockedHead(size_t index, TimeMs now) const {
    if (!settled_) return false;
    const int32_t q = result_.jobs[index].queue;
    if (q < 0 || blocked_head_[static_cast<size_t>(q)] == kNoJob) return false;
    const JobId head = blocked_head_[static_cast<size_t>(q)];
    return sched::PendingBefore(pending_jobs_[head], pending_jobs_[index], now, config_);
  }

  // Whether a cycle now would certainly start nothing, whatever the policy: every GPU is taken,
  // every pending job needs one, and no job may be preempted to make room. (The scheduler's own
  // early stop uses the same test; here it also saves building the cycle.)
  bool NothingCanStart() const {
    if (!options_.cycle_hints) return false;
    if (config_.preempt || config_.order == sched::QueueOrder::kLas) return false;
    if (cpu_only_pending_ != 0 || allocated_milli_ < usable_gpu_milli_) return false;
    return !(reclaim_possible_ && SomeQueueBelowGuarantee());
  }

  // A job reclaims only while its queue stays within its guarantee, so with every queue at or
  // above it no reclaim can start anything. Per-model guarantees are not tallied here: with any
  // of them, assume some queue may be below.
  bool SomeQueueBelowGuarantee() const {
    for (size_t q = 0; q < config_.queues.size(); ++q) {
      const sched::QueueConfig& queue = config_.queues[q];
      if (queue.PerModel() || queue_allocated_milli_[q] < queue.guaranteed_milli) return true;
    }
    return false;
  }

  void MoveQueued(size_t from, size_t to) {
    queue_[to] = queue_[from];
    queued_queue_index_[to] = queued_queue_index_[from];
    jobs_[queue_[to]->spec.id].slot = static_cast<int32_t>(to);
  }

  // Puts a job (new or preempted) into the queue at its place in the scheduler's order, shifting
  // whichever side is shorter: under FIFO new jobs go to the back, O(1).
  void Enqueue(size_t index, TimeMs now) {
    const sched::PendingJob* job = &pending_jobs_[index];
    if (job->spec.gpu_milli_per_task == 0) ++cpu_only_pending_;
    AddPendingInQueue(index, 1);
    JobState& state = jobs_[index];
    state.where = Where::kPending;
    auto live = queue_.begin() + static_cast<ptrdiff_t>(queue_head_);
    auto position = queue_.end();
    // Most jobs go last (FIFO arrivals): one comparison instead of a binary search.
    const auto before = [&](const sched::PendingJob* a, const sched::PendingJob* b) {
      return sched::PendingBefore(*a, *b, now, config_);
    };
    if (keep_sorted_ && live != queue_.end() && before(job, queue_.back())) {
      position = std::upper_bound(live, queue_.end(), job, before);
    }
    auto at = static_cast<size_t>(position - queue_.begin());
    if (queue_head_ > 0 && at - queue_head_ < queue_.size() - at) {
      for (size_t i = queue_head_; i < at; ++i)
        MoveQueued(i, i - 1);
      --queue_head_;
      --at;
      queue_[at] = job;
      queued_queue_index_[at] = result_.jobs[index].queue;
    } else {
      queue_.insert(position, job);
      queued_queue_index_.insert(queued_queue_index_.begin() + static_cast<ptrdiff_t>(at),
                                 result_.jobs[index].queue);
      for (size_t i = at + 1; i < queue_.size(); ++i)
        jobs_[queue_[i]->spec.id].slot = static_cast<int32_t>(i);
    }
    state.slot = static_cast<int32_t>(at);
  }

  // Closes the holes left by the jobs that started, keeping the order. Shifts whichever side of
  // the holes is shorter: the started jobs are mostly near the head, so this is O(started)
  // rather than O(queue) per cycle.
  void CompactPending() {
    std::sort(holes_.begin(), holes_.end());
    const size_t k = holes_.size();
    const auto first = static_cast<size_t>(holes_.front());
    const auto last = static_cast<size_t>(holes_.back());
    const size_t after = queue_.size() - first - k;    // live entries shifted left
    const size_t before = last - queue_head_ + 1 - k;  // live entries shifted right
    if (after <= before) {
      size_t write = first;
      for (size_t h = 0; h < k; ++h) {
        const size_t end = h + 1 < k ? static_cast<size_t>(holes_[h + 1]) : queue_.size();
        for (size_t read = static_cast<size_t>(holes_[h]) + 1; read < end; ++read)
          MoveQueued(read, write++);
      }
      queue_.resize(write);
      queued_queue_index_.resize(write);
    } else {
      size_t write = last;
      for (size_t h = k; h-- > 0;) {
        const size_t begin = h > 0 ? static_cast<size_t>(holes_[h - 1]) + 1 : queue_head_;
        for (size_t read = static_cast<size_t>(holes_[h]); read-- > begin;)
          MoveQueued(read, write--);
      }
      queue_head_ += k;
    }
    holes_.clear();
    // Drop the dead prefix once it outweighs the live part: amortised O(1) per job.
    if (queue_head_ > 1024 && queue_head_ * 2 > queue_.size()) {
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(queue_head_));
      queued_queue_index_.erase(queued_queue_index_.begin(),
                                queued_queue_index_.begin() + static_cast<ptrdiff_t>(queue_head_));
      queue_head_ = 0;
      for (size_t i = 0; i < queue_.size(); ++i)
        jobs_[queue_[i]->spec.id].slot = static_cast<int32_t>(i);
    }
  }

  void Record(TimeMs now) {
    const TimeSeriesPoint point{
        .time = now,
        .queue_length = static_cast<double>(PendingCount()),
        .allocated_gpus = static_cast<double>(allocated_milli_) / kMilliPerGpu};
    if (!series_.empty()) {
      TimeSeriesPoint& last = series_.back();
      if (last.queue_length == point.queue_length && last.allocated_gpus == point.allocated_gpus)
        return;
      if (last.time == now) {
        last = point;
        return;
      }
    }
    series_.push_back(point);
  }

  const Cluster& cluster_;
  const Trace& trace_;
  // A copy: under fair share the factors change before each cycle.
  sched::SchedulerConfig config_;
  std::optional<sched::FairShareLedger> fair_share_;
  const SimOptions& options_;
  // Free capacity with every running job committed, kept in step as jobs start and stop, so a
  // cycle need not re-commit all running jobs. With cycle hints the cycle works on it in place.
  sched::Allocator capacity_;
  bool applied_ = false;  // the decisions being applied are already in capacity_
  // See Settle: the last cycle decided nothing and only arrivals behind blocked heads came since.
  static constexpr JobId kNoJob = std::numeric_limits<JobId>::max();
  bool settled_ = false;
  std::vector<JobId> blocked_head_;  // per configured queue, as that cycle found them

  std::vector<JobState> jobs_;  // by trace position, which is also the scheduler's job id
  // A pending job lives at pending_jobs_[id] (its spec moves to running_ while it runs). queue_
  // points at the pending ones in the scheduler's order (arrival order when that order changes
  // over time), live from queue_head_ on.
  std::vector<sched::PendingJob> pending_jobs_;
  std::vector<const sched::PendingJob*> queue_;
  std::vector<int32_t> queued_queue_index_;  // beside queue_: each job's team queue, or -1
  size_t queue_head_ = 0;
  bool keep_sorted_ = true;
  std::vector<int32_t> fair_share_ranks_;  // each queue's place in the factor order, last cycle
  int64_t cpu_only_pending_ = 0;
  std::vector<int64_t> pending_per_queue_;  // pending jobs of each configured queue
  int64_t usable_gpu_milli_ = 0;
  std::vector<int32_t> holes_;  // queue slots of jobs started in this cycle
  std::vector<sched::RunningJob> running_;
  // What the attained-service update needs, parallel to running_: reading it from jobs_ would
  // miss the cache once per running job per cycle.
  struct RunningService {
    int64_t earlier_gpu_ms = 0;
    MilliGpu milli = 0;
  };
  std::vector<RunningService> running_service_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  int64_t allocated_milli_ = 0;
  static constexpr size_t kMaxBuckets = SimResult::kMaxQueueBuckets;
  static constexpr TimeMs kFirstQueueBucketMs = 3'600'000;  // one hour, doubled as needed
  std::vector<int64_t> queue_allocated_milli_;              // per team queue
  bool reclaim_possible_ = false;                           // some queue has a cohort
  TimeMs last_time_ = 0;
  std::vector<TimeSeriesPoint> series_;
  SimResult result_;
};

// The FGD fragmentation experiment: pods arrive one by one in file order and never leave; the
// list repeats (with new ids) until the first GPU pod does not fit.
//
// Each pod is one scheduling decision with nothing else pending and nothing to preempt, which
// sched::Schedule answers with Allocator::Place on an allocator holding every placed pod. The fast
// path keeps that allocator across pods (O(pods) in all) instead of letting Schedule rebuild it
// from the running list each time (O(pods^2)); FillEngine::kSchedule does the latter, and the
// tests check that both agree.
SimResult Fill(const Cluster& cluster, const Trace& trace, const sched::SchedulerConfig& config,
               const SimOptions& options) {
  const FillEngine engine = options.fill_engine;
  SimResult result;
  result.mode = SimMode::kFill;
  result.usable_gpus = cluster.UsableGpus();
  result.jobs_total = static_cast<int64_t>(trace.jobs.size());
  result.fill.usable_gpus = result.usable_gpus;
  // Nothing leaves in this experiment, so nothing may be pushed out either.
  sched::SchedulerConfig fill_config = config;
  fill_config.preempt = false;

  // File order, not submit order: the synthetic pod lists are not sorted by creation time.
  std::vector<const TraceJob*> pods;
  pods.reserve(trace.jobs.size());
  for (const TraceJob& job : trace.jobs)
    pods.push_back(&job);
  std::stable_sort(pods.begin(), pods.end(),
                   [](const TraceJob* a, const TraceJob* b) { return a->line < b->line; });

  const bool any_gpu_pod = std::any_of(pods.begin(), pods.end(), [](const TraceJob* job) {
    return job->spec.gpu_milli_per_task > 0;
  });
  std::optional<sched::Allocator> allocator;
  if (engine == FillEngine::kAllocator) {
    allocator.emplace(cluster);
    // What sched::ScheduleInPlace does with the config before placing (FGD only).
    if (fill_config.placement == sched::PlacementPolicy::kFgd)
      allocator->SetTargetWorkload(fill_config.target_workload);
  }
  std::vector<sched::RunningJob> running;
  // The paper's stopping rule: until the arrived pods asked for this many milli-GPUs.
  const int64_t arrived_limit =
      options.fill_arrived > 0
          ? std::llround(options.fill_arrived * static_cast<double>(result.usable_gpus) *
                         kMilliPerGpu)
          : -1;
  result.fill.arrived_target = options.fill_arrived;
  std::mt19937_64 rng(options.fill_shuffle_seed);
  JobId next_id = 0;
  bool done = false;
  while (!pods.empty() && !done) {
    ++result.fill.passes;
    if (options.fill_shuffle_seed != 0) {
      // Fisher-Yates with the generator's raw output: std::shuffle's use of it is unspecified.
      for (size_t i = pods.size() - 1; i > 0; --i)
        std::swap(pods[i], pods[static_cast<size_t>(rng() % (i + 1))]);
    }
    for (const TraceJob* pod : pods) {
      if (arrived_limit >= 0 && result.fill.arrived_gpu_milli >= arrived_limit) {
        done = true;
        break;
      }
      JobSpec spec = pod->spec;
      spec.id = next_id;
      // Submission order is the only order that matters here; time stands still otherwise.
      const auto now = static_cast<TimeMs>(next_id);
      spec.submit_time = now;
      ++next_id;
      ++result.scheduling_cycles;

      std::optional<sched::Allocation> allocation;
      std::optional<sched::WaitReason> reason;
      if (allocator) {
        allocation = allocator->Place(spec, fill_config.placement);
        // Only the first failure is reported; past it (SimOptions::fill_arrived) no reason is
        // needed, and CheckFeasible costs a pass over the cluster.
        if (!allocation && !result.fill.stop && spec.gpu_milli_per_task > 0) {
          reason = sched::CheckFeasible(cluster, spec);
          if (!reason) reason = allocator->WhyNotNow(spec);
        }
      } else {
        sched::PendingJob pending;
        pending.spec = spec;
        sched::Decisions decisions =
            sched::Schedule(cluster, std::span<const sched::RunningJob>(running),
                            std::span<const sched::PendingJob>(&pending, 1), now, fill_config);
        if (!decisions.placements.empty()) {
          allocation = std::move(decisions.placements.front().allocation);
          sched::RunningJob placed;
          placed.spec = spec;
          placed.allocation = *allocation;
          placed.start_time = now;
          running.push_back(std::move(placed));
        } else if (!decisions.waiting.empty()) {
          reason = decisions.waiting.front().reason;
        }
      }

      const bool wants_gpu = spec.gpu_milli_per_task > 0;
      result.fill.arrived_gpu_milli += spec.TotalGpuMilli();
      if (allocation) {
        ++result.fill.pods_placed;
        if (wants_gpu) ++result.fill.gpu_pods_placed;
        result.fill.allocated_gpu_milli += AllocatedMilli(*allocation);
        continue;
      }
      if (!wants_gpu) {
        ++result.fill.cpu_only_pods_failed;
        continue;
      }
      ++result.fill.gpu_pods_failed;
      if (!result.fill.stop) {
        FillStop stop;
        stop.trace_id = pod->trace_id;
        stop.line = pod->line;
        stop.tasks = spec.tasks;
        stop.gpu_milli_per_task = spec.gpu_milli_per_task;
        stop.reason = reason.value_or(sched::WaitReason::kInsufficientGpus);
        result.fill.stop = std::move(stop);
      }
      if (arrived_limit < 0) {
        done = true;
        break;
      }
    }
    // Without GPU pods nothing could ever stop the loop; one pass tells all.
    if (!any_gpu_pod) break;
  }
  if (arrived_limit < 0) result.fill.gpu_pods_failed = result.fill.stop ? 1 : 0;
  // The paper's fragmentation measure of where the run ended, for every placement alike.
  if (allocator) {
    sched::Allocator measure = *allocator;
    measure.SetTargetWorkload(TargetWorkloadOf(trace));
    result.fill.fragmented_gpu_milli = measure.Fragmentation();
  }
  return result;
}

}  // namespace

std::optional<Estimates> ParseEstimates(std::string_view name) {
  if (name == "none") return Estimates::kNone;
  if (name == "oracle") return Estimates::kOracle;
  return std::nullopt;
}

std::optional<SimMode> ParseSimMode(std::string_view name) {
  if (name == "replay") return SimMode::kReplay;
  if (name == "fill") return SimMode::kFill;
  return std::nullopt;
}

const char* Name(Estimates estimates) {
  return estimates == Estimates::kOracle ? "oracle" : "none";
}

const char* Name(SimMode mode) {
  return mode == SimMode::kFill ? "fill" : "replay";
}

std::vector<std::string> EstimatesNames() {
  return {"none", "oracle"};
}
std::vector<std::string> SimModeNames() {
  return {"replay", "fill"};
}

int64_t RemoveInfeasibleJobs(const Cluster& cluster, Trace& trace, bool skip_infeasible) {
  // Decide first and change the trace only when nothing throws.
  std::vector<std::optional<sched::WaitReason>> reasons(trace.jobs.size());
  // Feasibility depends only on the job's shape, and traces repeat a handful of shapes.
  using Shape = std::tuple<int32_t, MilliGpu, MilliCpu, MiB, MiB, std::vector<std::string>>;
  std::map<Shape, std::optional<sched::WaitReason>> by_shape;
  int64_t removed = 0;
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    const TraceJob& job = trace.jobs[i];
    Shape shape{job.spec.tasks,
                job.spec.gpu_milli_per_task,
                job.spec.cpu_milli_per_task,
                job.spec.memory_mib_per_task,
                job.spec.min_gpu_memory_mib,
                job.spec.gpu_models};
    auto [it, inserted] = by_shape.try_emplace(std::move(shape));
    if (inserted) it->second = sched::CheckFeasible(cluster, job.spec);
    reasons[i] = it->second;
    if (!reasons[i]) continue;
    std::string message = fmt::format(
        "{}:{}: job {}: {}", trace.source, job.line,
        job.trace_id.empty() ? fmt::format("#{}", job.spec.id) : fmt::format("'{}'", job.trace_id),
        sched::DescribeWait(*reasons[i], job.spec));
    if (!skip_infeasible) throw TraceError(message);
    ++removed;
    if (trace.skip_examples.size() < kMaxSkipExamples)
      trace.skip_examples.push_back(std::move(message));
  }
  if (removed == 0) return 0;
  size_t kept = 0;
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    if (reasons[i]) continue;
    if (kept != i) trace.jobs[kept] = std::move(trace.jobs[i]);
    ++kept;
  }
  trace.jobs.resize(kept);
  return removed;
}

double OfferedLoad(const Trace& trace, int64_t usable_gpus) {
  if (trace.jobs.size() < 2 || usable_gpus <= 0) return 0;
  const TimeMs span = trace.jobs.back().spec.submit_time - trace.jobs.front().spec.submit_time;
  if (span <= 0) return 0;
  double gpu_ms = 0;
  for (const TraceJob& job : trace.jobs) {
    gpu_ms += static_cast<double>(job.spec.TotalGpuMilli()) / kMilliPerGpu *
              static_cast<double>(job.duration);
  }
  return gpu_ms / (static_cast<double>(usable_gpus) * static_cast<double>(span));
}

void ScaleSubmitTimes(Trace& trace, double factor) {
  if (trace.jobs.empty()) return;
  const TimeMs first = trace.jobs.front().spec.submit_time;
  for (TraceJob& job : trace.jobs) {
    const double offset = static_cast<double>(job.spec.submit_time - first) * factor;
    job.spec.submit_time = first + std::llround(offset);
  }
}

std::vector<TimeSeriesPoint> Downsample(const std::vector<TimeSeriesPoint>& series, TimeMs end,
                                        int64_t max_points) {
  const auto n = static_cast<int64_t>(series.size());
  if (max_points <= 0 || n <= max_points) return series;
  const TimeMs start = series.front().time;
  end = std::max(end, series.back().time);
  if (max_points < 2 || end <= start) return {series.back()};
  // Buckets of equal width, then the end state as the last point.
  const int64_t buckets = max_points - 1;
  const double width = static_cast<double>(end - start) / static_cast<double>(buckets);
  std::vector<TimeSeriesPoint> out;
  out.reserve(static_cast<size_t>(max_points));
  size_t i = 0;  // the step in force at the bucket's start
  for (int64_t b = 0; b < buckets; ++b) {
    const double lo = static_cast<double>(start) + width * static_cast<double>(b);
    const double hi = b + 1 == buckets ? static_cast<double>(end) : lo + width;
    while (i + 1 < series.size() && static_cast<double>(series[i + 1].time) <= lo)
      ++i;
    double queue = 0;
    double allocated = 0;
    for (size_t j = i; j < series.size(); ++j) {
      const double step_lo = std::max(lo, static_cast<double>(series[j].time));
      const double step_hi =
          std::min(hi, j + 1 < series.size() ? static_cast<double>(series[j + 1].time)
                                             : static_cast<double>(end));
      if (step_hi > step_lo) {
        queue += series[j].queue_length * (step_hi - step_lo);
        allocated += series[j].allocated_gpus * (step_hi - step_lo);
      }
      if (step_hi >= hi) break;
    }
    const double covered = hi - lo;
    out.push_back(TimeSeriesPoint{.time = std::llround(lo),
                                  .queue_length = covered > 0 ? queue / covered : 0,
                                  .allocated_gpus = covered > 0 ? allocated / covered : 0});
  }
  TimeSeriesPoint last = series.back();
  last.time = end;
  out.push_back(last);
  return out;
}

std::vector<sched::TaskClass> TargetWorkloadOf(const Trace& trace, sched::WorkloadWeight weight) {
  std::vector<JobSpec> specs;
  specs.reserve(trace.jobs.size());
  for (const TraceJob& job : trace.jobs)
    specs.push_back(job.spec);
  return sched::TargetWorkloadOf(specs, weight);
}

SimResult Simulate(const Cluster& cluster, const Trace& trace, const sched::SchedulerConfig& config,
                   const SimOptions& options) {
  // FGD needs the workload's task distribution; the paper takes the replayed trace's shapes.
  if (config.placement == sched::PlacementPolicy::kFgd && config.target_workload.empty()) {
    sched::SchedulerConfig with_workload = config;
    with_workload.target_workload = TargetWorkloadOf(trace, options.fgd_weight);
    return Simulate(cluster, trace, with_workload, options);
  }
  if (options.mode == SimMode::kFill) return Fill(cluster, trace, config, options);
  return Replay(cluster, trace, config, options).Run();
}

}  // namespace gpufleet::sim
