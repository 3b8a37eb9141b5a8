#include "sched/policy.h"

#include <array>
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
constexpr std::array<std::pair<PlacementPolicy, const char*>, 2> kPlacements{{
    {PlacementPolicy::kBinPack, "binpack"},
    {PlacementPolicy::kSpread, "spread"},
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
