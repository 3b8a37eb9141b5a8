#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"
#include "sched/queues.h"

namespace gpufleet::sched {

// "Which job next": the order in which pending jobs are considered.
enum class QueueOrder {
  kFifo,  // priority, then submit time
  kSjf,   // priority, then shortest runtime estimate (jobs without one go last)
  kLas,   // Tiresias 2D-LAS: discretised attained GPU-service queues, preemptive
  // Slurm-style weighted fair share: priority, then the job's queue's fair-share factor (highest
  // first, SchedulerConfig::fair_share_factor), then submit time.
  kFairShare,
};

// What to do when the job at the head of the order does not fit.
enum class Backfill {
  kNone,      // strict: nothing behind it starts (Slurm without backfill, Kueue StrictFIFO)
  kEasy,      // EASY: the head gets a reservation; later jobs start only if they do not delay it
  kFirstFit,  // skip it and try the next (Kueue BestEffortFIFO, Tiresias)
};

// "Where": how a job's tasks are placed on nodes and GPUs.
enum class PlacementPolicy {
  kBinPack,  // best fit: fill the fullest nodes and GPUs first, keep whole nodes free for gangs
  kSpread,   // worst fit: the emptiest nodes first
};

struct SchedulerConfig {
  QueueOrder order = QueueOrder::kFifo;
  Backfill backfill = Backfill::kNone;
  PlacementPolicy placement = PlacementPolicy::kBinPack;
  // Pending jobs may preempt running preemptible jobs that rank strictly lower in the order.
  bool preempt = false;
  // 2D-LAS queue limits in GPU-seconds of attained service; a job moves to queue k+1 once its
  // service passes limit k. Tiresias uses two queues; 3,200 GPU-s is close to its default.
  std::vector<int64_t> las_queue_limits_gpu_s = {3200};
  // Tiresias' starvation guard: a job that waited more than this many times its attained run time
  // goes back to the first queue. 0 disables it.
  double las_starvation_factor = 0.0;
  // Team queues with guaranteed GPU quotas (docs/quotas.md). Empty: no quota logic at all, and
  // jobs' queue names are ignored.
  std::vector<QueueConfig> queues;
  // Fair share (kFairShare): how fast past usage is forgotten; Slurm's PriorityDecayHalfLife
  // defaults to 7 days.
  int64_t fair_share_half_life_s = 7 * 24 * 3600;
  // Fair share: each queue's factor in (0, 1] as FairShareFactors (sched/fair_share.h) computes
  // it from decayed usage. The only part of the config that changes over time: the caller
  // refreshes it before each cycle. A queue not listed has used nothing (factor 1).
  std::map<std::string, double, std::less<>> fair_share_factor;
};

std::optional<QueueOrder> ParseQueueOrder(std::string_view name);
std::optional<Backfill> ParseBackfill(std::string_view name);
std::optional<PlacementPolicy> ParsePlacementPolicy(std::string_view name);
const char* Name(QueueOrder order);
const char* Name(Backfill backfill);
const char* Name(PlacementPolicy placement);
// The names accepted by the parsers above, for help texts and error messages.
std::vector<std::string> QueueOrderNames();
std::vector<std::string> BackfillNames();
std::vector<std::string> PlacementPolicyNames();

// The backfill mode a queue order uses when none is asked for: strict FIFO stays strict, SJF and
// LAS skip jobs that do not fit (as in the Tiresias paper), fair share backfills behind a
// reservation (as Slurm's sched/backfill).
Backfill DefaultBackfill(QueueOrder order);

}  // namespace gpufleet::sched
