#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cluster.h"
#include "core/job.h"
#include "sched/policy.h"
#include "sched/types.h"

namespace gpufleet::sched {

// Free capacity of a cluster during one scheduling cycle, indexed for fast placement: nodes are
// bucketed by their number of free whole GPUs, and racks and spines keep free-GPU sums, so a
// single-GPU placement is O(1) on a uniform cluster and a gang placement looks at racks before
// nodes. Unschedulable nodes and unhealthy GPUs are never offered, but allocations already on them
// (jobs that were running before a drain or a fault) are accepted by Commit.
class Allocator {
 public:
  explicit Allocator(const Cluster& cluster);

  // Places every task of the job or none (gang all-or-nothing) and records the allocation.
  std::optional<Allocation> Place(const JobSpec& spec, PlacementPolicy policy);
  // Records an allocation made elsewhere. Throws std::invalid_argument when it names a node or GPU
  // that does not exist or takes more than is free (a double allocation).
  void Commit(const JobSpec& spec, const Allocation& allocation);
  void Release(const JobSpec& spec, const Allocation& allocation);

  // Why a job that Place just refused does not fit now.
  WaitReason WhyNotNow(const JobSpec& spec) const;
  // Whether the job could fit this cluster were nothing running on it: the infeasibility reason,
  // or nothing. Depends only on the cluster, not on what is committed.
  std::optional<WaitReason> WhyNeverFits(const JobSpec& spec) const;

  // How many tasks of `gpus_per_task` whole GPUs each the nodes' free whole GPUs could hold now:
  // Place certainly refuses a gang of more tasks, and this is exact for jobs without CPU, memory
  // or GPU-model constraints. O(GPUs per node).
  int64_t WholeGpuTasksAtMost(int32_t gpus_per_task) const;

  // The target workload kFgd placement measures fragmentation against (SchedulerConfig::
  // target_workload). Setting the one it already has keeps what was computed for it.
  void SetTargetWorkload(const std::vector<TaskClass>& classes);
  const std::vector<TaskClass>& target_workload() const { return fgd_classes_; }
  // FGD's measure of fragmentation: the free milli-GPUs of usable GPUs that a task drawn from the
  // target workload could not use, in expectation over its classes, summed over nodes. A task
  // that cannot run on a node at all (CPU, memory, GPU count or model) cannot use any of its free
  // GPUs; one that can cannot use the GPUs with less free than its per-GPU demand. Zero without a
  // target workload. O(nodes x GPUs x classes).
  double Fragmentation() const;

  int64_t FreeGpuMilli() const { return free_gpu_milli_total_; }
  const Cluster& cluster() const { return cluster_; }
  int64_t UsableGpuMilli() const { return usable_gpu_milli_total_; }

  // Whether both describe the same cluster with the same free capacity, however they got there.
  friend bool operator==(const Allocator& a, const Allocator& b);

 private:
  // Which GPUs a job may use, resolved once per placement.
  struct Eligibility {
    uint64_t model_mask = ~uint64_t{0};
    MiB min_memory = 0;
    bool unconstrained = true;
    bool any_model_known = true;  // false when none of the asked models exists in the cluster
  };
  struct NodeState {
    MilliCpu free_cpu = 0;
    MiB free_memory = 0;
    int32_t gpu_begin = 0;  // first GPU in the flat GPU arrays
    int32_t gpu_count = 0;
    int32_t usable_gpus = 0;  // healthy GPUs, whether free or not
    int32_t free_whole = 0;   // healthy GPUs with nothing allocated
    int32_t rack = 0;
    int32_t spine = 0;
    bool schedulable = true;
    friend bool operator==(const NodeState&, const NodeState&) = default;
  };

  // A set of nodes visited in index order, so that which of several equal nodes a placement picks
  // depends only on the cluster's state, never on the order of the changes that led to it (the
  // simulator keeps one Allocator across cycles; the server builds a new one each cycle).
  class NodeSet {
   public:
    void Resize(size_t nodes) { words_.assign((nodes + 63) / 64, 0); }
    void Insert(int32_t node) { words_[Word(node)] |= Bit(node); }
    void Erase(int32_t node) { words_[Word(node)] &= ~Bit(node); }
    friend bool operator==(const NodeSet&, const NodeSet&) = default;
    // Calls visit(node) in index order until it returns false.
    template <typename Visit>
    void ForEach(Visit&& visit) const {
      for (size_t w = 0; w < words_.size(); ++w) {
        for (uint64_t bits = words_[w]; bits != 0; bits &= bits - 1) {
          const int32_t node = static_cast<int32_t>(w * 64) + __builtin_ctzll(bits);
          if (!visit(node)) return;
        }
      }
    }

   private:
    static size_t Word(int32_t node) { return static_cast<size_t>(node) >> 6; }
    static uint64_t Bit(int32_t node) { return uint64_t{1} << (node & 63); }
    std::vector<uint64_t> words_;
  };

  Eligibility EligibilityOf(const JobSpec& spec) const;
  bool GpuEligible(int32_t flat_gpu, const Eligibility& eligibility) const;
  // How many tasks of this job fit on the node now.
  int32_t TasksFit(int32_t node, const JobSpec& spec, const Eligibility& eligibility) const;
  int32_t EligibleFreeWhole(int32_t node, const Eligibility& eligibility) const;

  std::optional<Allocation> PlaceWholeGang(const JobSpec& spec, const Eligibility& eligibility,
                                           PlacementPolicy policy);
  std::vector<int32_t> AllNodes() const;  // 0, 1, ... every node, for SpreadOverNodes
  // Shared-GPU and CPU-only jobs with tasks_per_node: a group of that many tasks on each of
  // tasks / tasks_per_node distinct nodes.
  std::optional<Allocation> PlaceNodeGroups(const JobSpec& spec, const Eligibility& eligibility,
                                            PlacementPolicy policy);
  bool PlaceSharedTask(const JobSpec& spec, const Eligibility& eligibility, PlacementPolicy policy,
                       Allocation& allocation);
  bool PlaceCpuOnlyTask(const JobSpec& spec, PlacementPolicy policy, Allocation& allocation);
  // Chooses the nodes for `tasks` tasks among `candidates`, fewest nodes first (with
  // tasks_per_node: exactly that many on each); returns pairs of (node, task count) or nothing
  // when they cannot hold the gang.
  std::optional<std::vector<std::pair<int32_t, int32_t>>> SpreadOverNodes(
      const std::vector<int32_t>& candidates, const JobSpec& spec, const Eligibility& eligibility,
      PlacementPolicy policy) const;
  // Takes whole GPUs for one task on a node, preferring a single NVLink island.
  TaskPlacement TakeWholeGpus(int32_t node, const JobSpec& spec, const Eligibility& eligibility);
  // The flat GPUs TakeWholeGpus would take, in GPU order.
  std::vector<int32_t> ChooseWholeGpus(int32_t node, const JobSpec& spec,
                                       const Eligibility& eligibility) const;

  // FGD (PlacementPolicy::kFgd). The target workload's classes with a GPU demand, grouped by what
  // they ask of GPUs, so that a node's GPUs are looked at once per group rather than per class.
  struct FgdMember {
    MilliCpu cpu = 0;
    MiB memory = 0;
    int64_t weight = 0;
  };
  struct FgdGroup {
    MilliGpu per_gpu = 0;  // demand on each GPU it uses: the share, or 1000 for whole GPUs
    int32_t gpus = 1;      // GPUs with that much free it needs on one node
    Eligibility eligibility;
    int64_t weight = 0;    // of all members
    MilliCpu max_cpu = 0;  // of the members: a node with this much free holds every one
    MiB max_memory = 0;
    std::vector<FgdMember> members;
  };
  // The node's fragmentation (in milli-GPU x weight) were its GPUs' free shares `free` (one per
  // GPU of the node) and its free CPU and memory these.
  int64_t NodeFragmentation(int32_t node, const MilliGpu* free, MilliCpu free_cpu,
                            MiB free_memory) const;
  int64_t NodeFragmentationNow(int32_t node);
  // How much placing one task of the job on the node would increase the node's fragmentation, and
  // on which GPU for a shared task; `fits` false when the task does not fit there.
  struct FgdChoice {
    uint32_t version = 0;  // the node's version it was computed for; 0: never
    bool fits = false;
    int32_t gpu = -1;  // flat GPU, shared tasks only
    int64_t delta = 0;
  };
  FgdChoice EvaluateFgd(int32_t node, const JobSpec& spec, const Eligibility& eligibility);
  // The cached choice for the job's task shape on every node, recomputed for changed nodes only.
  std::vector<FgdChoice>& FgdChoicesFor(const JobSpec& spec);
  // The node for one task under FGD, or -1: the least increase of fragmentation; among equal
  // increases best fit's choice, the node with the fewest free milli-GPUs, then the lowest node.
  int32_t ChooseFgdNode(const JobSpec& spec, const Eligibility& eligibility, int32_t* gpu);
  int64_t NodeFreeMilli(int32_t node) const;
  void Touch(int32_t node) { ++node_version_[static_cast<size_t>(node)]; }

  void TakeGpuMilli(int32_t flat_gpu, MilliGpu milli);
  void ReturnGpuMilli(int32_t flat_gpu, MilliGpu milli);
  void ChangeGpuFree(int32_t flat_gpu, MilliGpu delta);
  void UpdateSharedIndex(int32_t flat_gpu, MilliGpu before, MilliGpu after);
  void SetFreeWhole(int32_t node, int32_t free_whole);
  void BucketInsert(int32_t node);
  void BucketRemove(int32_t node);

  const Cluster& cluster_;
  std::vector<NodeState> nodes_;
  // Flat per-GPU arrays, node by node.
  std::vector<MilliGpu> gpu_free_;
  std::vector<uint8_t> gpu_model_;
  std::vector<MiB> gpu_memory_;
  std::vector<int32_t> gpu_island_;
  std::vector<int32_t> gpu_node_;
  std::vector<uint8_t> gpu_usable_;       // healthy and on a schedulable node
  std::vector<std::string> model_names_;  // model id -> name (at most 64 models)

  // Schedulable nodes by their number of free whole GPUs, and how many are in each bucket.
  std::vector<NodeSet> buckets_;
  std::vector<int32_t> bucket_size_;
  int32_t max_gpus_per_node_ = 0;
  // Usable GPUs shared by fractional tasks with room left, as (free milli-GPUs, flat GPU): a
  // shared placement finds the tightest or roomiest one without scanning every node.
  std::set<std::pair<MilliGpu, int32_t>> shared_gpus_;

  std::vector<std::vector<int32_t>> rack_nodes_;
  std::vector<std::vector<int32_t>> spine_nodes_;
  std::vector<int32_t> rack_free_whole_;
  std::vector<int32_t> spine_free_whole_;

  int64_t free_gpu_milli_total_ = 0;
  int64_t usable_gpu_milli_total_ = 0;

  // FGD state. None of it is part of the free capacity (operator== ignores it): the target
  // workload, its resolved groups, and caches keyed by node versions, which change with every
  // change to a node, so that a cached value is only ever used for the state it was computed on.
  std::vector<TaskClass> fgd_classes_;
  std::vector<FgdGroup> fgd_groups_;
  int64_t fgd_cpu_only_weight_ = 0;  // classes without GPUs: every free GPU is a fragment to them
  std::vector<uint32_t> node_version_;
  std::vector<std::pair<uint32_t, int64_t>> node_fragmentation_;  // (version, fragmentation)
  struct FgdShapeKey {
    MilliGpu gpu = 0;
    MilliCpu cpu = 0;
    MiB memory = 0;
    MiB min_gpu_memory = 0;
    std::vector<std::string> models;
    friend bool operator==(const FgdShapeKey&, const FgdShapeKey&) = default;
  };
  struct FgdShapeHash {
    size_t operator()(const FgdShapeKey& key) const;
  };
  std::unordered_map<FgdShapeKey, size_t, FgdShapeHash> fgd_shape_ids_;
  std::vector<std::vector<FgdChoice>> fgd_choices_;  // [shape id][node]
  std::vector<MilliGpu> fgd_scratch_;                // one node's free shares, being evaluated
};

}  // namespace gpufleet::sched
