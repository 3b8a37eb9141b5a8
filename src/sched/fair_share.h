#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "core/types.h"
#include "sched/queues.h"

// Weighted fair share between queues over time, as Slurm's classic fair-share factor: each
// queue's GPU usage decays with a half-life, and a queue that used less than its weighted share
// of the recent past goes first (docs/quotas.md). Pure bookkeeping: the caller (server or
// simulator) reports the spans its jobs held GPUs and asks for the factors before each cycle.
namespace gpufleet::sched {

// A job still holding GPUs: `gpus` GPUs (fractions allowed) since `start`.
struct OpenSpan {
  std::string_view queue;
  double gpus = 0;
  TimeMs start = 0;
};

// Decayed GPU-seconds per queue. A span's GPU-seconds count in full at the moment they are used
// and halve every half-life after that, so usage(t) = sum over spans of
// gpus * integral over the span of 2^-((t - s) / half_life) ds. Exact for any order of spans.
class FairShareLedger {
 public:
  explicit FairShareLedger(int64_t half_life_s);

  // A span that ended: `gpus` GPUs held from `start` to `end`. Spans may come in any order.
  void AddSpan(std::string_view queue, double gpus, TimeMs start, TimeMs end);

  // Decayed GPU-seconds of every queue at `now` (not before the latest span's end), counting the
  // spans still open as used up to `now`.
  std::map<std::string, double, std::less<>> UsageAt(TimeMs now,
                                                     std::span<const OpenSpan> open) const;

  int64_t half_life_s() const { return half_life_s_; }

 private:
  // GPU-seconds that `gpus` GPUs held over [start, end] are worth at `at`.
  double Decayed(double gpus, TimeMs start, TimeMs end, TimeMs at) const;

  int64_t half_life_s_;
  TimeMs reference_ = 0;  // usage_ is as of this time
  std::map<std::string, double, std::less<>> usage_;
};

// Slurm's classic fair-share factor of every queue: F = 2^(-U/S), U the queue's part of all
// decayed usage and S its part of the weights, so F = 0.5 when a queue used exactly its share,
// above when less, and 1 when it used nothing. `queues` gives the weights; without configured
// queues every queue that appears in `usage` weighs 1.
std::map<std::string, double, std::less<>> FairShareFactors(
    const std::map<std::string, double, std::less<>>& usage, std::span<const QueueConfig> queues);

}  // namespace gpufleet::sched
