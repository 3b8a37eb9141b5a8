#include "sched/allocator.h"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

namespace gpufleet::sched {
namespace {

constexpr int32_t kManyTasks = std::numeric_limits<int32_t>::max();

int32_t Intern(std::unordered_map<std::string, int32_t>& ids, const std::string& name) {
  auto [it, inserted] = ids.emplace(name, static_cast<int32_t>(ids.size()));
  return it->second;
}

}  // namespace

Allocator::Allocator(const Cluster& cluster) : cluster_(cluster) {
  std::unordered_map<std::string, int32_t> model_ids;
  std::unordered_map<std::string, int32_t> rack_ids;
  std::unordered_map<std::string, int32_t> spine_ids;
  nodes_.resize(cluster.nodes.size());
  for (size_t n = 0; n < cluster.nodes.size(); ++n) {
    const Node& node = cluster.nodes[n];
    NodeState& state = nodes_[n];
    state.free_cpu = node.cpu_milli;
    state.free_memory = node.memory_mib;
    state.gpu_begin = static_cast<int32_t>(gpu_free_.size());
    state.gpu_count = static_cast<int32_t>(node.gpus.size());
    state.schedulable = node.schedulable;
    state.rack = Intern(rack_ids, node.rack);
    // Spine names are only unique together with nothing else: racks of one spine share it.
    state.spine = Intern(spine_ids, node.spine);
    max_gpus_per_node_ = std::max(max_gpus_per_node_, state.gpu_count);
    for (const Gpu& gpu : node.gpus) {
      const int32_t model = Intern(model_ids, gpu.model);
      if (model >= 64) throw std::invalid_argument("more than 64 distinct GPU models in a cluster");
      const bool usable = node.schedulable && gpu.healthy;
      gpu_free_.push_back(kMilliPerGpu);
      gpu_model_.push_back(static_cast<uint8_t>(model));
      gpu_memory_.push_back(gpu.memory_mib);
      gpu_island_.push_back(gpu.nvlink_island);
      gpu_node_.push_back(static_cast<int32_t>(n));
      gpu_usable_.push_back(usable ? 1 : 0);
      if (usable) {
        ++state.usable_gpus;
        ++state.free_whole;
        usable_gpu_milli_total_ += kMilliPerGpu;
      }
    }
  }
  free_gpu_milli_total_ = usable_gpu_milli_total_;
  node_version_.assign(nodes_.size(), 1);
  node_fragmentation_.assign(nodes_.size(), {0, 0});
  model_names_.resize(model_ids.size());
  for (const auto& [name, id] : model_ids)
    model_names_[static_cast<size_t>(id)] = name;

  rack_nodes_.resize(rack_ids.size());
  spine_nodes_.resize(spine_ids.size());
  rack_free_whole_.assign(rack_ids.size(), 0);
  spine_free_whole_.assign(spine_ids.size(), 0);
  buckets_.resize(static_cast<size_t>(max_gpus_per_node_) + 1);
  bucket_size_.assign(buckets_.size(), 0);
  for (NodeSet& bucket : buckets_)
    bucket.Resize(nodes_.size());
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n) {
    const NodeState& state = nodes_[static_cast<size_t>(n)];
    rack_nodes_[static_cast<size_t>(state.rack)].push_back(n);
    spine_nodes_[static_cast<size_t>(state.spine)].push_back(n);
    rack_free_whole_[static_cast<size_t>(state.rack)] += state.free_whole;
    spine_free_whole_[static_cast<size_t>(state.spine)] += state.free_whole;
    if (state.schedulable) BucketInsert(n);
  }
}

void Allocator::BucketInsert(int32_t node) {
  const auto b = static_cast<size_t>(nodes_[static_cast<size_t>(node)].free_whole);
  buckets_[b].Insert(node);
  ++bucket_size_[b];
}

void Allocator::BucketRemove(int32_t node) {
  const auto b = static_cast<size_t>(nodes_[static_cast<size_t>(node)].free_whole);
  buckets_[b].Erase(node);
  --bucket_size_[b];
}

bool operator==(const Allocator& a, const Allocator& b) {
  return a.nodes_ == b.nodes_ && a.gpu_free_ == b.gpu_free_ && a.gpu_model_ == b.gpu_model_ &&
         a.gpu_memory_ == b.gpu_memory_ && a.gpu_island_ == b.gpu_island_ &&
         a.gpu_node_ == b.gpu_node_ && a.gpu_usable_ == b.gpu_usable_ &&
         a.model_names_ == b.model_names_ && a.buckets_ == b.buckets_ &&
         a.bucket_size_ == b.bucket_size_ && a.max_gpus_per_node_ == b.max_gpus_per_node_ &&
         a.shared_gpus_ == b.shared_gpus_ && a.rack_nodes_ == b.rack_nodes_ &&
         a.spine_nodes_ == b.spine_nodes_ && a.rack_free_whole_ == b.rack_free_whole_ &&
         a.spine_free_whole_ == b.spine_free_whole_ &&
         a.free_gpu_milli_total_ == b.free_gpu_milli_total_ &&
         a.usable_gpu_milli_total_ == b.usable_gpu_milli_total_;
}

void Allocator::SetFreeWhole(int32_t node, int32_t free_whole) {
  NodeState& state = nodes_[static_cast<size_t>(node)];
  const int32_t delta = free_whole - state.free_whole;
  if (delta == 0) return;
  if (state.schedulable) BucketRemove(node);
  state.free_whole = free_whole;
  if (state.schedulable) BucketInsert(node);
  rack_free_whole_[static_cast<size_t>(state.rack)] += delta;
  spine_free_whole_[static_cast<size_t>(state.spine)] += delta;
}

void Allocator::UpdateSharedIndex(int32_t flat_gpu, MilliGpu before, MilliGpu after) {
  const bool was_shared = before > 0 && before < kMilliPerGpu;
  const bool is_shared = after > 0 && after < kMilliPerGpu;
  if (was_shared) shared_gpus_.erase({before, flat_gpu});
  if (is_shared) shared_gpus_.insert({after, flat_gpu});
}

void Allocator::TakeGpuMilli(int32_t flat_gpu, MilliGpu milli) {
  ChangeGpuFree(flat_gpu, -milli);
}

void Allocator::ReturnGpuMilli(int32_t flat_gpu, MilliGpu milli) {
  ChangeGpuFree(flat_gpu, milli);
}

// Keeps free_whole, the shared-GPU index and the totals in step with one GPU's free share.
void Allocator::ChangeGpuFree(int32_t flat_gpu, MilliGpu delta) {
  const size_t g = static_cast<size_t>(flat_gpu);
  const MilliGpu before = gpu_free_[g];
  const MilliGpu after = before + delta;
  gpu_free_[g] = after;
  Touch(gpu_node_[g]);
  if (!gpu_usable_[g]) return;
  free_gpu_milli_total_ += delta;
  const int32_t node = gpu_node_[g];
  UpdateSharedIndex(flat_gpu, before, after);
  const int32_t whole_delta =
      static_cast<int32_t>(after == kMilliPerGpu) - static_cast<int32_t>(before == kMilliPerGpu);
  if (whole_delta != 0)
    SetFreeWhole(node, nodes_[static_cast<size_t>(node)].free_whole + whole_delta);
}

void Allocator::Commit(const JobSpec& spec, const Allocation& allocation) {
  if (static_cast<int32_t>(allocation.size()) != spec.tasks)
    throw std::invalid_argument(fmt::format("job {}: allocation has {} tasks, spec asks for {}",
                                            spec.id, allocation.size(), spec.tasks));
  for (const TaskPlacement& task : allocation) {
    if (task.node < 0 || task.node >= static_cast<int32_t>(nodes_.size()))
      throw std::invalid_argument(fmt::format("job {}: no node {}", spec.id, task.node));
    const NodeState& state = nodes_[static_cast<size_t>(task.node)];
    for (const GpuShare& share : task.gpus) {
      if (share.gpu < 0 || share.gpu >= state.gpu_count || share.milli <= 0 ||
          share.milli > kMilliPerGpu)
        throw std::invalid_argument(fmt::format("job {}: bad GPU share {}:{} on node {}", spec.id,
                                                share.gpu, share.milli, task.node));
    }
  }
  // Take task by task; a task that does not fit rolls back the ones before it, so a bad
  // allocation changes nothing. This runs for every running job in every cycle: no maps.
  for (size_t t = 0; t < allocation.size(); ++t) {
    const TaskPlacement& task = allocation[t];
    NodeState& state = nodes_[static_cast<size_t>(task.node)];
    std::string problem;
    if (spec.cpu_milli_per_task > state.free_cpu || spec.memory_mib_per_task > state.free_memory)
      problem = fmt::format("job {}: node {} CPU or memory over-allocated", spec.id, task.node);
    size_t taken = 0;
    for (; problem.empty() && taken < task.gpus.size(); ++taken) {
      const GpuShare& share = task.gpus[taken];
      const int32_t gpu = state.gpu_begin + share.gpu;
      if (share.milli > gpu_free_[static_cast<size_t>(gpu)]) {
        problem = fmt::format("job {}: GPU {} double-allocated ({} milli-GPU asked, {} free)",
                              spec.id, gpu, share.milli, gpu_free_[static_cast<size_t>(gpu)]);
        break;
      }
      TakeGpuMilli(gpu, share.milli);
    }
    if (!problem.empty()) {
      for (size_t g = 0; g < taken; ++g)
        ReturnGpuMilli(state.gpu_begin + task.gpus[g].gpu, task.gpus[g].milli);
      JobSpec done = spec;
      done.tasks = static_cast<int32_t>(t);
      Release(done, Allocation(allocation.begin(), allocation.begin() + static_cast<long>(t)));
      throw std::invalid_argument(problem);
    }
    state.free_cpu -= spec.cpu_milli_per_task;
    state.free_memory -= spec.memory_mib_per_task;
    Touch(task.node);
  }
}

void Allocator::Release(const JobSpec& spec, const Allocation& allocation) {
  for (const TaskPlacement& task : allocation) {
    NodeState& state = nodes_[static_cast<size_t>(task.node)];
    state.free_cpu += spec.cpu_milli_per_task;
    state.free_memory += spec.memory_mib_per_task;
    Touch(task.node);
    for (const GpuShare& share : task.gpus)
      ReturnGpuMilli(state.gpu_begin + share.gpu, share.milli);
  }
}

Allocator::Eligibility Allocator::EligibilityOf(const JobSpec& spec) const {
  Eligibility e;
  e.min_memory = spec.min_gpu_memory_mib;
  if (!spec.gpu_models.empty()) {
    e.model_mask = 0;
    for (const std::string& model : spec.gpu_models) {
      auto it = std::find(model_names_.begin(), model_names_.end(), model);
      if (it != model_names_.end()) e.model_mask |= uint64_t{1} << (it - model_names_.begin());
    }
    e.any_model_known = e.model_mask != 0;
  }
  e.unconstrained = spec.gpu_models.empty() && spec.min_gpu_memory_mib == 0;
  return e;
}

bool Allocator::GpuEligible(int32_t flat_gpu, const Eligibility& e) const {
  const size_t g = static_cast<size_t>(flat_gpu);
  return gpu_usable_[g] && ((e.model_mask >> gpu_model_[g]) & 1) != 0 &&
         gpu_memory_[g] >= e.min_memory;
}

int32_t Allocator::EligibleFreeWhole(int32_t node, const Eligibility& e) const {
  const NodeState& state = nodes_[static_cast<size_t>(node)];
  if (e.unconstrained) return state.free_whole;
  int32_t count = 0;
  for (int32_t g = state.gpu_begin; g < state.gpu_begin + state.gpu_count; ++g)
    count += (gpu_free_[static_cast<size_t>(g)] == kMilliPerGpu && GpuEligible(g, e)) ? 1 : 0;
  return count;
}

int32_t Allocator::TasksFit(int32_t node, const JobSpec& spec, const Eligibility& e) const {
  const NodeState& state = nodes_[static_cast<size_t>(node)];
  if (!state.schedulable) return 0;
  int32_t fit = kManyTasks;
  if (spec.Fractional()) {
    int32_t shares = 0;
    for (int32_t g = state.gpu_begin; g < state.gpu_begin + state.gpu_count; ++g)
      if (GpuEligible(g, e)) shares += gpu_free_[static_cast<size_t>(g)] / spec.gpu_milli_per_task;
    fit = shares;
  } else if (const int32_t whole = spec.WholeGpusPerTask(); whole > 0) {
    fit = EligibleFreeWhole(node, e) / whole;
  }
  if (spec.cpu_milli_per_task > 0)
    fit = static_cast<int32_t>(std::min<int64_t>(fit, state.free_cpu / spec.cpu_milli_per_task));
  if (spec.memory_mib_per_task > 0)
    fit =
        static_cast<int32_t>(std::min<int64_t>(fit, state.free_memory / spec.memory_mib_per_task));
  return fit;
}

std::optional<Allocation> Allocator::Place(const JobSpec& spec, PlacementPolicy policy) {
  const Eligibility e = EligibilityOf(spec);
  // GPU constraints bind only jobs that take GPUs, as in WhyNeverFits.
  if (spec.gpu_milli_per_task > 0 && !e.any_model_known) return std::nullopt;
  // FGD without a target workload has nothing to measure fragmentation against: best fit.
  if (policy == PlacementPolicy::kFgd && fgd_groups_.empty() && fgd_cpu_only_weight_ == 0)
    policy = PlacementPolicy::kBinPack;
  if (spec.WholeGpusPerTask() > 0) {
    // FGD chooses the node of a single-node task. Gangs over several nodes keep best fit's
    // rack- and spine-local placement: the paper's tasks are single pods.
    if (policy == PlacementPolicy::kFgd && spec.tasks > 1) policy = PlacementPolicy::kBinPack;
    return PlaceWholeGang(spec, e, policy);
  }

  // Groups on distinct nodes keep best fit's choice of nodes, as gangs do.
  if (spec.tasks_per_node > 0)
    return PlaceNodeGroups(spec, e,
                           policy == PlacementPolicy::kFgd ? PlacementPolicy::kBinPack : policy);
  // Shared-GPU and CPU-only gangs are placed task by task and rolled back on failure.
  Allocation allocation;
  allocation.reserve(static_cast<size_t>(spec.tasks));
  for (int32_t t = 0; t < spec.tasks; ++t) {
    const bool placed = spec.Fractional() ? PlaceSharedTask(spec, e, policy, allocation)
                                          : PlaceCpuOnlyTask(spec, policy, allocation);
    if (!placed) {
      JobSpec partial = spec;
      partial.tasks = static_cast<int32_t>(allocation.size());
      Release(partial, allocation);
      return std::nullopt;
    }
  }
  return allocation;
}

std::optional<Allocation> Allocator::PlaceWholeGang(const JobSpec& spec, const Eligibility& e,
                                                    PlacementPolicy policy) {
  const int32_t per_task = spec.WholeGpusPerTask();
  const int32_t total = per_task * spec.tasks;
  std::vector<std::pair<int32_t, int32_t>> chosen;  // (node, tasks)

  // Say no before scanning any node when even all of them together cannot hold the gang.
  if (WholeGpuTasksAtMost(per_task) < spec.tasks) return std::nullopt;

  if (policy == PlacementPolicy::kFgd) {  // a single task (Place)
    const int32_t node = ChooseFgdNode(spec, e, nullptr);
    if (node < 0) return std::nullopt;
    Allocation allocation{TakeWholeGpus(node, spec, e)};
    nodes_[static_cast<size_t>(node)].free_cpu -= spec.cpu_milli_per_task;
    nodes_[static_cast<size_t>(node)].free_memory -= spec.memory_mib_per_task;
    Touch(node);
    return allocation;
  }

  // 1. One node for the whole gang: best fit scans buckets from the smallest that can hold it.
  if (total <= max_gpus_per_node_ && spec.Nodes() <= 1) {
    const bool ascending = policy == PlacementPolicy::kBinPack;
    for (int32_t i = 0; i <= max_gpus_per_node_ - total && chosen.empty(); ++i) {
      const int32_t b = ascending ? total + i : max_gpus_per_node_ - i;
      buckets_[static_cast<size_t>(b)].ForEach([&](int32_t node) {
        if (TasksFit(node, spec, e) < spec.tasks) return true;
        chosen.emplace_back(node, spec.tasks);
        return false;
      });
    }
  }

  // A single task that no node holds fits nowhere.
  if (chosen.empty() && spec.tasks == 1) return std::nullopt;

  // 2./3. One rack, then one spine: the fewest network hops for the gang's collectives.
  auto try_groups = [&](const std::vector<std::vector<int32_t>>& group_nodes,
                        const std::vector<int32_t>& group_free) {
    std::vector<int32_t> groups;
    for (int32_t g = 0; g < static_cast<int32_t>(group_free.size()); ++g)
      if (group_free[static_cast<size_t>(g)] >= total) groups.push_back(g);
    // Best fit tries the tightest group first so that large free groups stay whole.
    std::sort(groups.begin(), groups.end(), [&](int32_t a, int32_t b) {
      const int32_t fa = group_free[static_cast<size_t>(a)];
      const int32_t fb = group_free[static_cast<size_t>(b)];
      if (fa != fb) return policy == PlacementPolicy::kBinPack ? fa < fb : fa > fb;
      return a < b;
    });
    for (int32_t g : groups) {
      if (auto nodes = SpreadOverNodes(group_nodes[static_cast<size_t>(g)], spec, e, policy)) {
        chosen = std::move(*nodes);
        return;
      }
    }
  };
  if (chosen.empty() && rack_nodes_.size() > 1) try_groups(rack_nodes_, rack_free_whole_);
  if (chosen.empty() && spine_nodes_.size() > 1) try_groups(spine_nodes_, spine_free_whole_);

  // 4. Anywhere.
  if (chosen.empty()) {
    auto nodes = SpreadOverNodes(AllNodes(), spec, e, policy);
    if (!nodes) return std::nullopt;
    chosen = std::move(*nodes);
  }

  Allocation allocation;
  allocation.reserve(static_cast<size_t>(spec.tasks));
  for (const auto& [node, count] : chosen) {
    for (int32_t t = 0; t < count; ++t)
      allocation.push_back(TakeWholeGpus(node, spec, e));
    nodes_[static_cast<size_t>(node)].free_cpu -= spec.cpu_milli_per_task * count;
    nodes_[static_cast<size_t>(node)].free_memory -= spec.memory_mib_per_task * count;
    Touch(node);
  }
  return allocation;
}

std::vector<int32_t> Allocator::AllNodes() const {
  std::vector<int32_t> all(nodes_.size());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

std::optional<Allocation> Allocator::PlaceNodeGroups(const JobSpec& spec, const Eligibility& e,
                                                     PlacementPolicy policy) {
  const auto chosen = SpreadOverNodes(AllNodes(), spec, e, policy);
  if (!chosen) return std::nullopt;
  Allocation allocation;
  allocation.reserve(static_cast<size_t>(spec.tasks));
  for (const auto& [node, count] : *chosen) {
    NodeState& state = nodes_[static_cast<size_t>(node)];
    for (int32_t t = 0; t < count; ++t) {
      TaskPlacement task{.node = node, .gpus = {}};
      if (spec.Fractional()) {
        // The GPU of this node that best fit (least room that holds the share) or spread (most
        // room) would take; TasksFit counted the shares, so one is there.
        int32_t best = -1;
        for (int32_t g = state.gpu_begin; g < state.gpu_begin + state.gpu_count; ++g) {
          const MilliGpu free = gpu_free_[static_cast<size_t>(g)];
          if (free < spec.gpu_milli_per_task || !GpuEligible(g, e)) continue;
          const MilliGpu best_free = best < 0 ? 0 : gpu_free_[static_cast<size_t>(best)];
          if (best < 0 ||
              (policy == PlacementPolicy::kSpread ? free > best_free : free < best_free))
            best = g;
        }
        TakeGpuMilli(best, spec.gpu_milli_per_task);
        task.gpus.push_back({.gpu = best - state.gpu_begin, .milli = spec.gpu_milli_per_task});
      }
      allocation.push_back(std::move(task));
    }
    state.free_cpu -= spec.cpu_milli_per_task * count;
    state.free_memory -= spec.memory_mib_per_task * count;
    Touch(node);
  }
  return allocation;
}

int64_t Allocator::WholeGpuTasksAtMost(int32_t gpus_per_task) const {
  // No node holds more tasks than its free whole GPUs allow (TasksFit), and every schedulable
  // node is in the bucket of its free whole GPUs.
  int64_t at_most = 0;
  for (int32_t b = std::max(gpus_per_task, 1); b <= max_gpus_per_node_; ++b)
    at_most += int64_t{bucket_size_[static_cast<size_t>(b)]} * (b / gpus_per_task);
  return at_most;
}

std::optional<std::vector<std::pair<int32_t, int32_t>>> Allocator::SpreadOverNodes(
    const std::vector<int32_t>& candidates, const JobSpec& spec, const Eligibility& e,
    PlacementPolicy policy) const {
  struct Fit {
    int32_t node, tasks, free_whole;
  };
  std::vector<Fit> fits;
  int64_t capacity = 0;
  const int32_t group = spec.tasks_per_node;
  for (int32_t node : candidates) {
    int32_t tasks = std::min(TasksFit(node, spec, e), spec.tasks);
    if (group > 0) tasks = tasks >= group ? group : 0;  // exactly its group, or none
    if (tasks <= 0) continue;
    fits.push_back({node, tasks, nodes_[static_cast<size_t>(node)].free_whole});
    capacity += tasks;
  }
  if (capacity < spec.tasks) return std::nullopt;
  // Fewest nodes first: the nodes that hold the most tasks; among equals, best fit takes the
  // fullest nodes and spread the emptiest.
  std::sort(fits.begin(), fits.end(), [&](const Fit& a, const Fit& b) {
    if (a.tasks != b.tasks) return a.tasks > b.tasks;
    if (a.free_whole != b.free_whole)
      return policy == PlacementPolicy::kBinPack ? a.free_whole < b.free_whole
                                                 : a.free_whole > b.free_whole;
    return a.node < b.node;
  });
  std::vector<std::pair<int32_t, int32_t>> chosen;
  int32_t remaining = spec.tasks;
  for (const Fit& fit : fits) {
    if (remaining == 0) break;
    const int32_t take = std::min(fit.tasks, remaining);
    chosen.emplace_back(fit.node, take);
    remaining -= take;
  }
  return chosen;
}

std::vector<int32_t> Allocator::ChooseWholeGpus(int32_t node, const JobSpec& spec,
                                                const Eligibility& e) const {
  const NodeState& state = nodes_[static_cast<size_t>(node)];
  const int32_t want = spec.WholeGpusPerTask();
  // Free eligible GPUs per NVLink island, in GPU order.
  std::vector<std::pair<int32_t, std::vector<int32_t>>> islands;
  for (int32_t g = state.gpu_begin; g < state.gpu_begin + state.gpu_count; ++g) {
    if (gpu_free_[static_cast<size_t>(g)] != kMilliPerGpu || !GpuEligible(g, e)) continue;
    const int32_t island = gpu_island_[static_cast<size_t>(g)];
    auto it = std::find_if(islands.begin(), islands.end(),
                           [&](const auto& entry) { return entry.first == island; });
    if (it == islands.end()) {
      islands.push_back({island, {}});
      it = std::prev(islands.end());
    }
    it->second.push_back(g);
  }
  // One island if any holds the task: the smallest such island, keeping larger ones whole.
  // Otherwise the largest islands first, so the task spans as few as possible.
  std::stable_sort(islands.begin(), islands.end(), [&](const auto& a, const auto& b) {
    const bool a_fits = static_cast<int32_t>(a.second.size()) >= want;
    const bool b_fits = static_cast<int32_t>(b.second.size()) >= want;
    if (a_fits != b_fits) return a_fits;
    return a_fits ? a.second.size() < b.second.size() : a.second.size() > b.second.size();
  });
  std::vector<int32_t> chosen;
  chosen.reserve(static_cast<size_t>(want));
  for (const auto& island : islands) {
    for (int32_t g : island.second) {
      if (static_cast<int32_t>(chosen.size()) == want) break;
      chosen.push_back(g);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

TaskPlacement Allocator::TakeWholeGpus(int32_t node, const JobSpec& spec, const Eligibility& e) {
  const int32_t begin = nodes_[static_cast<size_t>(node)].gpu_begin;
  TaskPlacement task{.node = node, .gpus = {}};
  for (int32_t g : ChooseWholeGpus(node, spec, e)) {
    task.gpus.push_back({.gpu = g - begin, .milli = kMilliPerGpu});
    TakeGpuMilli(g, kMilliPerGpu);
  }
  return task;
}

bool Allocator::PlaceSharedTask(const JobSpec& spec, const Eligibility& e, PlacementPolicy policy,
                                Allocation& allocation) {
  const MilliGpu want = spec.gpu_milli_per_task;
  auto node_has_room = [&](const NodeState& s) {
    return s.schedulable && s.free_cpu >= spec.cpu_milli_per_task &&
           s.free_memory >= spec.memory_mib_per_task;
  };
  int32_t best_gpu = -1;
  int32_t best_node = -1;
  // A GPU already shared, from the index ordered by free share: best fit takes the one with the
  // least room left that still holds the share, spread the one with the most; ties go to the
  // lowest GPU.
  auto try_shared = [&](int32_t g) {
    const int32_t n = gpu_node_[static_cast<size_t>(g)];
    if (!GpuEligible(g, e) || !node_has_room(nodes_[static_cast<size_t>(n)])) return false;
    best_gpu = g;
    best_node = n;
    return true;
  };
  auto find_shared_gpu = [&] {
    if (policy == PlacementPolicy::kBinPack) {
      for (auto it = shared_gpus_.lower_bound({want, 0}); it != shared_gpus_.end(); ++it)
        if (try_shared(it->second)) return;
      return;
    }
    // Descending free share, and within one free share ascending GPU.
    auto group_end = shared_gpus_.end();
    while (group_end != shared_gpus_.begin() && std::prev(group_end)->first >= want) {
      const auto group_begin = shared_gpus_.lower_bound({std::prev(group_end)->first, 0});
      for (auto it = group_begin; it != group_end; ++it)
        if (try_shared(it->second)) return;
      group_end = group_begin;
    }
  };
  // A whole free GPU, on the fullest node that has one (best fit) or the emptiest.
  auto find_whole_gpu = [&] {
    const bool ascending = policy == PlacementPolicy::kBinPack;
    for (int32_t i = 0; i < max_gpus_per_node_ && best_gpu < 0; ++i) {
      const int32_t b = ascending ? 1 + i : max_gpus_per_node_ - i;
      buckets_[static_cast<size_t>(b)].ForEach([&](int32_t node) {
        const NodeState& s = nodes_[static_cast<size_t>(node)];
        if (!node_has_room(s)) return true;
        for (int32_t g = s.gpu_begin; g < s.gpu_begin + s.gpu_count; ++g) {
          if (gpu_free_[static_cast<size_t>(g)] == kMilliPerGpu && GpuEligible(g, e)) {
            best_gpu = g;
            best_node = node;
            return false;
          }
        }
        return true;
      });
    }
  };
  // Best fit fills shared GPUs before opening a whole one. Spread is worst fit: the GPU with the
  // most room, which is a whole free GPU whenever one is left.
  if (policy == PlacementPolicy::kFgd) {
    best_node = ChooseFgdNode(spec, e, &best_gpu);
  } else if (policy == PlacementPolicy::kBinPack) {
    find_shared_gpu();
    if (best_gpu < 0) find_whole_gpu();
  } else {
    find_whole_gpu();
    if (best_gpu < 0) find_shared_gpu();
  }
  if (best_gpu < 0) return false;
  NodeState& s = nodes_[static_cast<size_t>(best_node)];
  TakeGpuMilli(best_gpu, want);
  s.free_cpu -= spec.cpu_milli_per_task;
  s.free_memory -= spec.memory_mib_per_task;
  Touch(best_node);
  allocation.push_back(
      {.node = best_node, .gpus = {{.gpu = best_gpu - s.gpu_begin, .milli = want}}});
  return true;
}

bool Allocator::PlaceCpuOnlyTask(const JobSpec& spec, PlacementPolicy policy,
                                 Allocation& allocation) {
  int32_t best = -1;
  // FGD: CPU and memory taken from a node can keep GPU tasks off its free GPUs.
  if (policy == PlacementPolicy::kFgd) best = ChooseFgdNode(spec, Eligibility{}, nullptr);
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()) && policy != PlacementPolicy::kFgd;
       ++n) {
    const NodeState& s = nodes_[static_cast<size_t>(n)];
    if (!s.schedulable || s.free_cpu < spec.cpu_milli_per_task ||
        s.free_memory < spec.memory_mib_per_task)
      continue;
    if (best < 0) {
      best = n;
      continue;
    }
    const NodeState& b = nodes_[static_cast<size_t>(best)];
    // CPU-only work goes to nodes without free GPUs first, so it does not strand them.
    const auto key = [](const NodeState& x) { return std::pair(x.free_whole, x.free_cpu); };
    if (policy == PlacementPolicy::kBinPack ? key(s) < key(b) : key(s) > key(b)) best = n;
  }
  if (best < 0) return false;
  NodeState& s = nodes_[static_cast<size_t>(best)];
  s.free_cpu -= spec.cpu_milli_per_task;
  s.free_memory -= spec.memory_mib_per_task;
  Touch(best);
  allocation.push_back({.node = best, .gpus = {}});
  return true;
}

WaitReason Allocator::WhyNotNow(const JobSpec& spec) const {
  if (spec.gpu_milli_per_task == 0) return WaitReason::kInsufficientCpuOrMemory;
  // The tasks counted below never hold more than the free share of usable GPUs.
  if (spec.TotalGpuMilli() > free_gpu_milli_total_) return WaitReason::kInsufficientGpus;
  // Would the GPUs alone hold the gang, ignoring CPU and memory?
  JobSpec gpus_only = spec;
  gpus_only.cpu_milli_per_task = 0;
  gpus_only.memory_mib_per_task = 0;
  const Eligibility e = EligibilityOf(spec);
  // With tasks_per_node: in groups, each on a node of its own.
  const int32_t group = spec.tasks_per_node;
  const int64_t wanted = group > 0 ? spec.Nodes() : spec.tasks;
  int64_t found = 0;
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()) && found < wanted; ++n) {
    const int32_t fit = TasksFit(n, gpus_only, e);
    found += group > 0 ? (fit >= group ? 1 : 0) : fit;
  }
  return found >= wanted ? WaitReason::kInsufficientCpuOrMemory : WaitReason::kInsufficientGpus;
}

std::optional<WaitReason> Allocator::WhyNeverFits(const JobSpec& spec) const {
  const Eligibility e = EligibilityOf(spec);
  // Usable GPUs on a node that the job may use; without constraints that is known in advance.
  auto eligible_on = [&](int32_t n) -> int64_t {
    const NodeState& state = nodes_[static_cast<size_t>(n)];
    if (e.unconstrained) return state.usable_gpus;
    int64_t count = 0;
    for (int32_t g = state.gpu_begin; g < state.gpu_begin + state.gpu_count; ++g)
      count += GpuEligible(g, e) ? 1 : 0;
    return count;
  };
  if (spec.gpu_milli_per_task > 0) {
    int64_t eligible = 0;
    for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n)
      eligible += eligible_on(n);
    if (!e.any_model_known || eligible == 0)
      return e.unconstrained ? WaitReason::kInfeasibleGpuCount : WaitReason::kInfeasibleGpuModel;
    if (!spec.Fractional() && eligible < int64_t{spec.WholeGpusPerTask()} * spec.tasks)
      return WaitReason::kInfeasibleGpuCount;
  }
  // Tasks per node with nothing running: from the node's capacity, not its free state, so the
  // answer is the same on an Allocator with any commits.
  int64_t tasks = 0;
  int64_t group_nodes = 0;  // nodes that can hold tasks_per_node of its tasks
  bool any_node = false;
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n) {
    const NodeState& state = nodes_[static_cast<size_t>(n)];
    const Node& node = cluster_.nodes[static_cast<size_t>(n)];
    if (!state.schedulable) continue;
    int64_t fit = std::numeric_limits<int32_t>::max();
    if (spec.gpu_milli_per_task > 0) {
      const int64_t eligible = eligible_on(n);
      fit = spec.Fractional() ? eligible * (kMilliPerGpu / spec.gpu_milli_per_task)
                              : eligible / spec.WholeGpusPerTask();
    }
    if (spec.cpu_milli_per_task > 0) fit = std::min(fit, node.cpu_milli / spec.cpu_milli_per_task);
    if (spec.memory_mib_per_task > 0)
      fit = std::min(fit, node.memory_mib / spec.memory_mib_per_task);
    any_node = any_node || fit > 0;
    tasks += fit;
    if (spec.tasks_per_node > 0 && fit >= spec.tasks_per_node) ++group_nodes;
  }
  if (!any_node) return WaitReason::kInfeasibleTaskShape;
  if (tasks < spec.tasks) return WaitReason::kInfeasibleGpuCount;
  if (spec.tasks_per_node > 0 && group_nodes < spec.Nodes())
    return WaitReason::kInfeasibleNodeCount;
  return std::nullopt;
}

// ---- FGD: fragmentation gradient descent (Weng et al., USENIX ATC'23) ----

size_t Allocator::FgdShapeHash::operator()(const FgdShapeKey& key) const {
  size_t h = std::hash<int64_t>{}(key.gpu);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  mix(std::hash<int64_t>{}(key.cpu));
  mix(std::hash<int64_t>{}(key.memory));
  mix(std::hash<int64_t>{}(key.min_gpu_memory));
  for (const std::string& model : key.models)
    mix(std::hash<std::string>{}(model));
  return h;
}

void Allocator::SetTargetWorkload(const std::vector<TaskClass>& classes) {
  if (classes == fgd_classes_) return;
  fgd_classes_ = classes;
  fgd_groups_.clear();
  fgd_cpu_only_weight_ = 0;
  fgd_shape_ids_.clear();
  fgd_choices_.clear();
  // Fragmentations cached for the old workload are stale: versions restart above every old one.
  const uint32_t next = *std::max_element(node_version_.begin(), node_version_.end()) + 1;
  node_version_.assign(nodes_.size(), next);
  for (const TaskClass& c : classes) {
    if (c.weight <= 0) continue;
    if (c.gpu_milli_per_task <= 0) {
      fgd_cpu_only_weight_ += c.weight;
      continue;
    }
    JobSpec spec;
    spec.gpu_milli_per_task = c.gpu_milli_per_task;
    spec.gpu_models = c.gpu_models;
    spec.min_gpu_memory_mib = c.min_gpu_memory_mib;
    FgdGroup group;
    group.per_gpu = std::min(c.gpu_milli_per_task, kMilliPerGpu);
    group.gpus = spec.Fractional() ? 1 : spec.WholeGpusPerTask();
    group.eligibility = EligibilityOf(spec);
    auto same = [&](const FgdGroup& g) {
      return g.per_gpu == group.per_gpu && g.gpus == group.gpus &&
             g.eligibility.model_mask == group.eligibility.model_mask &&
             g.eligibility.min_memory == group.eligibility.min_memory;
    };
    auto it = std::find_if(fgd_groups_.begin(), fgd_groups_.end(), same);
    if (it == fgd_groups_.end()) it = fgd_groups_.insert(fgd_groups_.end(), std::move(group));
    it->weight += c.weight;
    it->max_cpu = std::max(it->max_cpu, c.cpu_milli_per_task);
    it->max_memory = std::max(it->max_memory, c.memory_mib_per_task);
    it->members.push_back(
        {.cpu = c.cpu_milli_per_task, .memory = c.memory_mib_per_task, .weight = c.weight});
  }
}

int64_t Allocator::NodeFragmentation(int32_t node, const MilliGpu* free, MilliCpu free_cpu,
                                     MiB free_memory) const {
  const NodeState& s = nodes_[static_cast<size_t>(node)];
  if (!s.schedulable) return 0;
  // The usable GPUs' free shares, largest first, and their running sums: a group without GPU
  // constraints can use the first k of them, k found by a short scan.
  std::array<MilliGpu, 16> sorted{};
  std::array<int64_t, 17> sums{};
  int32_t count = 0;
  const bool small = s.gpu_count <= static_cast<int32_t>(sorted.size());
  int64_t total = 0;  // free milli-GPUs of the node's usable GPUs
  for (int32_t i = 0; i < s.gpu_count; ++i) {
    if (!gpu_usable_[static_cast<size_t>(s.gpu_begin + i)]) continue;
    total += free[i];
    if (small) sorted[static_cast<size_t>(count++)] = free[i];
  }
  if (total == 0) return 0;
  if (small) {
    std::sort(sorted.begin(), sorted.begin() + count, std::greater<>());
    for (int32_t i = 0; i < count; ++i)
      sums[static_cast<size_t>(i) + 1] =
          sums[static_cast<size_t>(i)] + sorted[static_cast<size_t>(i)];
  }
  int64_t fragmentation = fgd_cpu_only_weight_ * total;
  for (const FgdGroup& group : fgd_groups_) {
    // The free GPUs this group can use: eligible, with at least its per-GPU demand free.
    int32_t usable = 0;
    int64_t usable_free = 0;
    if (small && group.eligibility.unconstrained) {
      while (usable < count && sorted[static_cast<size_t>(usable)] >= group.per_gpu)
        ++usable;
      usable_free = sums[static_cast<size_t>(usable)];
    } else {
      for (int32_t i = 0; i < s.gpu_count; ++i) {
        if (free[i] >= group.per_gpu && GpuEligible(s.gpu_begin + i, group.eligibility)) {
          ++usable;
          usable_free += free[i];
        }
      }
    }
    if (usable < group.gpus) {  // no member fits: every free GPU is a fragment to all of them
      fragmentation += group.weight * total;
      continue;
    }
    if (group.max_cpu <= free_cpu && group.max_memory <= free_memory) {  // every member fits
      fragmentation += group.weight * (total - usable_free);
      continue;
    }
    for (const FgdMember& m : group.members) {
      const bool fits = m.cpu <= free_cpu && m.memory <= free_memory;
      fragmentation += m.weight * (fits ? total - usable_free : total);
    }
  }
  return fragmentation;
}

int64_t Allocator::NodeFragmentationNow(int32_t node) {
  auto& [version, value] = node_fragmentation_[static_cast<size_t>(node)];
  const uint32_t now = node_version_[static_cast<size_t>(node)];
  if (version != now) {
    const NodeState& s = nodes_[static_cast<size_t>(node)];
    value = NodeFragmentation(node, gpu_free_.data() + s.gpu_begin, s.free_cpu, s.free_memory);
    version = now;
  }
  return value;
}

double Allocator::Fragmentation() const {
  int64_t weight = fgd_cpu_only_weight_;
  for (const FgdGroup& group : fgd_groups_)
    weight += group.weight;
  if (weight == 0) return 0;
  int64_t sum = 0;
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n) {
    const NodeState& s = nodes_[static_cast<size_t>(n)];
    sum += NodeFragmentation(n, gpu_free_.data() + s.gpu_begin, s.free_cpu, s.free_memory);
  }
  return static_cast<double>(sum) / static_cast<double>(weight);
}

Allocator::FgdChoice Allocator::EvaluateFgd(int32_t node, const JobSpec& spec,
                                            const Eligibility& e) {
  FgdChoice choice;
  choice.version = node_version_[static_cast<size_t>(node)];
  const NodeState& s = nodes_[static_cast<size_t>(node)];
  if (!s.schedulable || s.free_cpu < spec.cpu_milli_per_task ||
      s.free_memory < spec.memory_mib_per_task)
    return choice;
  const MilliCpu cpu_after = s.free_cpu - spec.cpu_milli_per_task;
  const MiB memory_after = s.free_memory - spec.memory_mib_per_task;
  const int64_t before = NodeFragmentationNow(node);
  // The node's free shares after the placement, edited in place for each candidate.
  std::vector<MilliGpu>& free = fgd_scratch_;
  free.assign(gpu_free_.begin() + s.gpu_begin, gpu_free_.begin() + s.gpu_begin + s.gpu_count);
  if (spec.gpu_milli_per_task == 0) {
    choice.fits = true;
    choice.delta = NodeFragmentation(node, free.data(), cpu_after, memory_after) - before;
  } else if (!spec.Fractional()) {
    if (EligibleFreeWhole(node, e) < spec.WholeGpusPerTask()) return choice;
    // Which GPUs matters only across models or memory sizes; take the ones placement takes.
    for (int32_t g : ChooseWholeGpus(node, spec, e))
      free[static_cast<size_t>(g - s.gpu_begin)] = 0;
    choice.fits = true;
    choice.delta = NodeFragmentation(node, free.data(), cpu_after, memory_after) - before;
  } else {
    const MilliGpu want = spec.gpu_milli_per_task;
    for (int32_t i = 0; i < s.gpu_count; ++i) {
      const int32_t g = s.gpu_begin + i;
      const MilliGpu had = free[static_cast<size_t>(i)];
      if (had < want || !GpuEligible(g, e)) continue;
      // An earlier GPU alike (same free share, model and memory) gives the same result.
      bool seen = false;
      for (int32_t j = 0; j < i && !seen; ++j) {
        const int32_t h = s.gpu_begin + j;
        seen = free[static_cast<size_t>(j)] == had && GpuEligible(h, e) &&
               gpu_model_[static_cast<size_t>(h)] == gpu_model_[static_cast<size_t>(g)] &&
               gpu_memory_[static_cast<size_t>(h)] == gpu_memory_[static_cast<size_t>(g)];
      }
      if (seen) continue;
      free[static_cast<size_t>(i)] = had - want;
      const int64_t delta = NodeFragmentation(node, free.data(), cpu_after, memory_after) - before;
      free[static_cast<size_t>(i)] = had;
      if (!choice.fits || delta < choice.delta) {
        choice.fits = true;
        choice.delta = delta;
        choice.gpu = g;
      }
    }
  }
  return choice;
}

std::vector<Allocator::FgdChoice>& Allocator::FgdChoicesFor(const JobSpec& spec) {
  FgdShapeKey key{.gpu = spec.gpu_milli_per_task,
                  .cpu = spec.cpu_milli_per_task,
                  .memory = spec.memory_mib_per_task,
                  .min_gpu_memory = spec.min_gpu_memory_mib,
                  .models = spec.gpu_models};
  auto it = fgd_shape_ids_.find(key);
  if (it == fgd_shape_ids_.end()) {
    // Bounded memory for servers that see endless shapes: start over past a few hundred.
    constexpr size_t kMaxCachedShapes = 256;
    if (fgd_choices_.size() == kMaxCachedShapes) {
      fgd_shape_ids_.clear();
      fgd_choices_.clear();
    }
    it = fgd_shape_ids_.emplace(std::move(key), fgd_choices_.size()).first;
    fgd_choices_.emplace_back(nodes_.size());
  }
  return fgd_choices_[it->second];
}

int64_t Allocator::NodeFreeMilli(int32_t node) const {
  const NodeState& s = nodes_[static_cast<size_t>(node)];
  int64_t sum = 0;
  for (int32_t g = s.gpu_begin; g < s.gpu_begin + s.gpu_count; ++g)
    sum += gpu_usable_[static_cast<size_t>(g)] ? gpu_free_[static_cast<size_t>(g)] : 0;
  return sum;
}

int32_t Allocator::ChooseFgdNode(const JobSpec& spec, const Eligibility& e, int32_t* gpu) {
  // A node's choice for this task shape changes only when the node does, so it is cached per
  // shape and node and recomputed for the nodes changed since: a placement among ~1,500 nodes
  // then costs a pass over the cache plus the few nodes that changed.
  std::vector<FgdChoice>& choices = FgdChoicesFor(spec);
  // Ties are common (placements that change no class's view of a node score alike); breaking
  // them as best fit does keeps emptier nodes whole for what comes later.
  int32_t best = -1;
  int64_t best_delta = 0;
  int64_t best_free = -1;  // the best node's free milli-GPUs, computed on the first tie
  for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n) {
    FgdChoice& choice = choices[static_cast<size_t>(n)];
    if (choice.version != node_version_[static_cast<size_t>(n)]) choice = EvaluateFgd(n, spec, e);
    if (!choice.fits) continue;
    if (best >= 0 && choice.delta > best_delta) continue;
    if (best >= 0 && choice.delta == best_delta) {
      if (best_free < 0) best_free = NodeFreeMilli(best);
      const int64_t free = NodeFreeMilli(n);
      if (free >= best_free) continue;
      best_free = free;
    } else {
      best_free = -1;
    }
    best = n;
    best_delta = choice.delta;
  }
  if (best >= 0 && gpu != nullptr) *gpu = choices[static_cast<size_t>(best)].gpu;
  return best;
}

}  // namespace gpufleet::sched
