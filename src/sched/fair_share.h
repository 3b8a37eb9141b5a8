#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

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

  // For a caller that sees every start and stop (the simulator), the ledger can keep the open
  // spans itself: Open when a job starts holding GPUs, Close (which adds the ended span) when it
  // stops, and UsageAt(now) then costs O(queues) instead of O(running jobs).
  void Open(std::string_view queue, double gpus, TimeMs start);
  void Close(std::string_view queue, double gpus, TimeMs start, TimeMs end);
  std::map<std::string, double, std::less<>> UsageAt(TimeMs now) const;

  int64_t half_life_s() const { return half_life_s_; }

 private:
  // GPU-seconds that `gpus` GPUs held over [start, end] are worth at `at`.
  double Decayed(double gpus, TimeMs start, TimeMs end, TimeMs at) const;
  // Moves the reference time forward to `to`, decaying what is kept.
  void AdvanceTo(TimeMs to);

  // The open spans of one queue, kept by Open and Close: how many, their GPUs, and their decayed
  // GPU-seconds as of the reference time, which AdvanceTo carries forward in O(1).
  struct OpenSum {
    int64_t spans = 0;
    double gpus = 0;
    double usage = 0;
  };
  // The decayed GPU-seconds of one queue's open spans at `at` (not before the reference time).
  double OpenUsageAt(const OpenSum& sum, TimeMs at) const;

  int64_t half_life_s_;
  TimeMs reference_ = 0;  // usage_ and the open sums are as of this time
  std::map<std::string, double, std::less<>> usage_;
  std::map<std::string, OpenSum, std::less<>> open_;
};

// Slurm's classic fair-share factor of every queue: F = 2^(-U/S), U the queue's part of all
// decayed usage and S its part of the weights, so F = 0.5 when a queue used exactly its share,
// above when less, and 1 when it used nothing. `queues` gives the weights; without configured
// queues every queue that appears in `usage` weighs 1.
std::unordered_map<std::string, double> FairShareFactors(
    const std::map<std::string, double, std::less<>>& usage, std::span<const QueueConfig> queues);

}  // namespace gpufleet::sched
