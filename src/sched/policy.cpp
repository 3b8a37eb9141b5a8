#include "sched/policy.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <utility>

namespace gpufleet::sched {
namespace {

template <typename Enum, size_t N>
std::optional<Enum> Lookup(const std::array<std::pair<Enum, const char*>, N>& table,
                           std::string_view name) {
  for (const auto& [value, text] : table)
    if (name == text) return value;
  return std::nullopt;
}

template <typename Enum, size_t N>
const char* NameIn(const std::array<std::pair<Enum, const char*>, N>& table, Enum value) {
  for (const auto& [candidate, text] : table)
    if (candidate == value) return text;
  return "unknown";
}

template <typename Enum, size_t N>
std::vector<std::string> NamesIn(const std::array<std::pair<Enum, const char*>, N>& table) {
  std::vector<std::string> names;
  for (const auto& entry : table)
    names.emplace_back(entry.second);
  return names;
}

constexpr std::array<std::pair<QueueOrder, const char*>, 4> kQueueOrders{{
    {QueueOrder::kFifo, "fifo"},
    {QueueOrder::kSjf, "sjf"},
    {QueueOrder::kLas, "las"},
    {QueueOrder::kFairShare, "fairshare"},
}};
constexpr std::array<std::pair<Backfill, const char*>, 3> kBackfills{{
    {Backfill::kNone, "none"},
    {Backfill::kEasy, "easy"},
    {Backfill::kFirstFit, "firstfit"},
}};
constexpr std::array<std::pair<PlacementPolicy, const char*>, 3> kPlacements{{
    {PlacementPolicy::kBinPack, "binpack"},
    {PlacementPolicy::kSpread, "spread"},
    {PlacementPolicy::kFgd, "fgd"},
}};
constexpr std::array<std::pair<WorkloadWeight, const char*>, 2> kWorkloadWeights{{
    {WorkloadWeight::kTasks, "tasks"},
    {WorkloadWeight::kGpus, "gpus"},
}};

}  // namespace

std::optional<QueueOrder> ParseQueueOrder(std::string_view name) {
  return Lookup(kQueueOrders, name);
}
std::optional<Backfill> ParseBackfill(std::string_view name) {
  return Lookup(kBackfills, name);
}
std::optional<PlacementPolicy> ParsePlacementPolicy(std::string_view name) {
  return Lookup(kPlacements, name);
}
const char* Name(QueueOrder order) {
  return NameIn(kQueueOrders, order);
}
const char* Name(Backfill backfill) {
  return NameIn(kBackfills, backfill);
}
const char* Name(PlacementPolicy placement) {
  return NameIn(kPlacements, placement);
}
std::vector<std::string> QueueOrderNames() {
  return NamesIn(kQueueOrders);
}
std::vector<std::string> BackfillNames() {
  return NamesIn(kBackfills);
}
std::vector<std::string> PlacementPolicyNames() {
  return NamesIn(kPlacements);
}

std::vector<TaskClass> TargetWorkloadOf(std::span<const JobSpec> jobs, WorkloadWeight weight) {
  using Key = std::tuple<MilliGpu, MilliCpu, MiB, MiB, std::vector<std::string>>;
  std::map<Key, size_t> index;  // shape -> position in `classes`
  std::vector<TaskClass> classes;
  for (const JobSpec& spec : jobs) {
    Key key{spec.gpu_milli_per_task, spec.cpu_milli_per_task, spec.memory_mib_per_task,
            spec.min_gpu_memory_mib, spec.gpu_models};
    auto [it, inserted] = index.emplace(std::move(key), classes.size());
    if (inserted) {
      classes.push_back({.gpu_milli_per_task = spec.gpu_milli_per_task,
                         .cpu_milli_per_task = spec.cpu_milli_per_task,
                         .memory_mib_per_task = spec.memory_mib_per_task,
                         .gpu_models = spec.gpu_models,
                         .min_gpu_memory_mib = spec.min_gpu_memory_mib,
                         .weight = 0});
    }
    const int64_t per_task =
        weight == WorkloadWeight::kGpus ? std::max(1, spec.WholeGpusPerTask()) : 1;
    classes[it->second].weight += per_task * spec.tasks;
  }
  return classes;
}

std::optional<WorkloadWeight> ParseWorkloadWeight(std::string_view name) {
  return Lookup(kWorkloadWeights, name);
}
const char* Name(WorkloadWeight weight) {
  return NameIn(kWorkloadWeights, weight);
}
std::vector<std::string> WorkloadWeightNames() {
  return NamesIn(kWorkloadWeights);
}

Backfill DefaultBackfill(QueueOrder order) {
  switch (order) {
    case QueueOrder::kFifo:
      return Backfill::kNone;
    case QueueOrder::kFairShare:
      return Backfill::kEasy;
    case QueueOrder::kSjf:
    case QueueOrder::kLas:
      break;
  }
  return Backfill::kFirstFit;
}

}  // namespace gpufleet::sched
