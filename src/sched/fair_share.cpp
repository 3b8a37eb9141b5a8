#include "sched/fair_share.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gpufleet::sched {

FairShareLedger::FairShareLedger(int64_t half_life_s)
    : half_life_s_(std::max<int64_t>(1, half_life_s)) {}

namespace {

// 1 - 2^-(ms / half_life_ms), without the cancellation of subtracting two nearby powers: spans
// are mostly hours against a half-life of days.
double DecayedFraction(TimeMs ms, double half_life_ms) {
  return -std::expm1(-static_cast<double>(ms) * std::numbers::ln2 / half_life_ms);
}

}  // namespace

double FairShareLedger::Decayed(double gpus, TimeMs start, TimeMs end, TimeMs at) const {
  if (end <= start || gpus <= 0) return 0;
  const double half_life_ms = static_cast<double>(half_life_s_) * kMsPerSecond;
  // The integral of 2^-((at - s) / h) over [start, end], in seconds:
  // h/ln2 x 2^-((at - end) / h) x (1 - 2^-((end - start) / h)).
  const double scale = static_cast<double>(half_life_s_) / std::numbers::ln2;
  const double near = std::exp2(-static_cast<double>(at - end) / half_life_ms);
  return gpus * scale * near * DecayedFraction(end - start, half_life_ms);
}

void FairShareLedger::AdvanceTo(TimeMs to) {
  // The reference only moves forward, so that no span is ever valued ahead of it.
  if (to <= reference_) return;
  const double half_life_ms = static_cast<double>(half_life_s_) * kMsPerSecond;
  const double factor = std::exp2(-static_cast<double>(to - reference_) / half_life_ms);
  for (auto& entry : usage_)
    entry.second *= factor;
  for (auto& entry : open_)
    entry.second.usage = OpenUsageAt(entry.second, to);
  reference_ = to;
}

double FairShareLedger::OpenUsageAt(const OpenSum& sum, TimeMs at) const {
  // What the open spans had decays, and their GPUs add what they used since: a sum of positive
  // terms, without cancellation.
  const double half_life_ms = static_cast<double>(half_life_s_) * kMsPerSecond;
  const TimeMs since = std::max<TimeMs>(0, at - reference_);
  const double factor = std::exp2(-static_cast<double>(since) / half_life_ms);
  const double grown =
      static_cast<double>(half_life_s_) / std::numbers::ln2 * DecayedFraction(since, half_life_ms);
  return sum.usage * factor + sum.gpus * grown;
}

void FairShareLedger::Open(std::string_view queue, double gpus, TimeMs start) {
  if (gpus <= 0) return;
  AdvanceTo(start);
  auto it = open_.find(queue);
  if (it == open_.end()) it = open_.emplace(std::string(queue), OpenSum{}).first;
  ++it->second.spans;
  it->second.gpus += gpus;
  it->second.usage += Decayed(gpus, start, reference_, reference_);  // a start in the past
}

void FairShareLedger::Close(std::string_view queue, double gpus, TimeMs start, TimeMs end) {
  if (gpus <= 0) return;
  AdvanceTo(end);
  if (auto it = open_.find(queue); it != open_.end() && it->second.spans > 0) {
    OpenSum& sum = it->second;
    // The last one out resets the sums, so that rounding never accumulates.
    if (--sum.spans == 0) {
      sum = OpenSum{};
    } else {
      sum.gpus -= gpus;
      sum.usage = std::max(0.0, sum.usage - Decayed(gpus, start, reference_, reference_));
    }
  }
  AddSpan(queue, gpus, start, end);
}

std::map<std::string, double, std::less<>> FairShareLedger::UsageAt(TimeMs now) const {
  std::map<std::string, double, std::less<>> usage = UsageAt(now, {});
  for (const auto& [queue, sum] : open_) {
    if (sum.spans == 0) continue;
    auto it = usage.find(queue);
    if (it == usage.end()) it = usage.emplace(queue, 0.0).first;
    it->second += OpenUsageAt(sum, now);
  }
  return usage;
}

void FairShareLedger::AddSpan(std::string_view queue, double gpus, TimeMs start, TimeMs end) {
  if (end <= start || gpus <= 0) return;
  AdvanceTo(end);
  auto it = usage_.find(queue);
  if (it == usage_.end()) it = usage_.emplace(std::string(queue), 0.0).first;
  it->second += Decayed(gpus, start, end, reference_);
}

std::map<std::string, double, std::less<>> FairShareLedger::UsageAt(
    TimeMs now, std::span<const OpenSpan> open) const {
  now = std::max(now, reference_);
  const double half_life_ms = static_cast<double>(half_life_s_) * kMsPerSecond;
  const double factor = std::exp2(-static_cast<double>(now - reference_) / half_life_ms);
  std::map<std::string, double, std::less<>> usage;
  for (const auto& [queue, value] : usage_)
    usage.emplace(queue, value * factor);
  for (const OpenSpan& span : open) {
    auto it = usage.find(span.queue);
    if (it == usage.end()) it = usage.emplace(std::string(span.queue), 0.0).first;
    it->second += Decayed(span.gpus, span.start, now, now);
  }
  return usage;
}

std::unordered_map<std::string, double> FairShareFactors(
    const std::map<std::string, double, std::less<>>& usage, std::span<const QueueConfig> queues) {
  std::map<std::string, double, std::less<>> weights;
  if (queues.empty()) {
    for (const auto& entry : usage)
      weights.emplace(entry.first, 1.0);
  } else {
    for (const QueueConfig& queue : queues)
      weights.emplace(queue.name, queue.weight);
  }
  double total_usage = 0;
  for (const auto& [queue, value] : usage)
    if (weights.contains(queue)) total_usage += value;
  double total_weight = 0;
  for (const auto& entry : weights)
    total_weight += entry.second;
  std::unordered_map<std::string, double> factors;
  for (const auto& [queue, weight] : weights) {
    const auto used = usage.find(queue);
    const double part_used =
        total_usage > 0 && used != usage.end() ? used->second / total_usage : 0.0;
    const double part_owed = weight / total_weight;
    factors.emplace(queue, std::exp2(-part_used / part_owed));
  }
  return factors;
}

}  // namespace gpufleet::sched
