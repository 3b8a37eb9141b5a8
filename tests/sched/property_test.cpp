// Randomized properties of sched::Schedule and sched::Allocator: whatever the cluster, queue and
// configuration, the decisions must be applicable (no GPU share, CPU or memory handed out twice),
// well formed (gang shape, constraints), complete (every pending job accounted for once),
// deterministic, and consistent with CheckFeasible. Every case is built from a seed printed on
// failure, so a failing case can be replayed alone.
#include <algorithm>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/cluster.h"
#include "sched/allocator.h"
#include "sched/rank.h"
#include "sched/scheduler.h"

namespace gpufleet::sched {
namespace {

constexpr int kScheduleCases = 600;
constexpr int kLargeScheduleCases = 20;
constexpr int kAllocatorCases = 200;

const std::vector<std::string> kModels = {"H100-80GB", "A100-40GB"};

struct Case {
  Cluster cluster;
  std::vector<RunningJob> running;
  std::vector<PendingJob> pending;
  TimeMs now = 0;
  SchedulerConfig config;
};

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  template <typename T>
  const T& Pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(Int(0, static_cast<int64_t>(items.size()) - 1))];
  }

 private:
  std::mt19937_64 engine_;
};

MiB MemoryOf(const std::string& model) {
  return model == "H100-80GB" ? 81'559 : 40'960;
}

Cluster RandomCluster(Random& random, int32_t max_nodes) {
  Cluster cluster;
  const auto nodes = static_cast<int32_t>(random.Int(1, max_nodes));
  const auto nodes_per_rack = static_cast<int32_t>(random.Int(1, 4));
  const auto racks_per_spine = static_cast<int32_t>(random.Int(1, 3));
  for (int32_t n = 0; n < nodes; ++n) {
    Node node;
    node.name = "n" + std::to_string(n);
    node.rack = "r" + std::to_string(n / nodes_per_rack);
    node.spine = "s" + std::to_string(n / nodes_per_rack / racks_per_spine);
    node.cpu_milli = random.Pick<MilliCpu>({8'000, 32'000, 128'000});
    node.memory_mib = random.Pick<MiB>({16'384, 65'536, 1'048'576});
    const auto gpus = static_cast<int32_t>(random.Pick<int64_t>({0, 1, 2, 4, 4, 8, 8, 8}));
    const int32_t island = random.Chance(0.5) ? std::max(1, gpus / 2) : std::max(1, gpus);
    const std::string node_model = random.Pick(kModels);
    const bool mixed = random.Chance(0.15);
    for (int32_t g = 0; g < gpus; ++g) {
      const std::string model = mixed ? random.Pick(kModels) : node_model;
      node.gpus.push_back(Gpu{.uuid = node.name + "-" + std::to_string(g),
                              .model = model,
                              .memory_mib = MemoryOf(model),
                              .index = g,
                              .nvlink_island = g / island,
                              .healthy = true});
    }
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

JobSpec RandomSpec(Random& random, JobId id, TimeMs now) {
  JobSpec spec;
  spec.id = id;
  spec.name = "job-" + std::to_string(id);
  spec.priority = static_cast<int32_t>(random.Int(0, 2));
  spec.tasks = static_cast<int32_t>(random.Pick<int64_t>({1, 1, 1, 1, 2, 2, 3, 4}));
  if (spec.tasks > 1 && random.Chance(0.3))
    spec.tasks_per_node = spec.tasks % 2 == 0 && random.Chance(0.5) ? 2 : 1;
  spec.gpu_milli_per_task = static_cast<MilliGpu>(
      random.Pick<int64_t>({0, 250, 300, 500, 1000, 1000, 1000, 2000, 2000, 4000, 8000, 16000}));
  if (random.Chance(0.4)) spec.cpu_milli_per_task = random.Pick<MilliCpu>({1'000, 4'000, 16'000});
  if (random.Chance(0.3)) spec.memory_mib_per_task = random.Pick<MiB>({1'024, 8'192, 32'768});
  if (spec.gpu_milli_per_task == 0 && spec.cpu_milli_per_task == 0) spec.cpu_milli_per_task = 2'000;
  if (random.Chance(0.25))
    spec.gpu_models = random.Pick<std::vector<std::string>>(
        {{"H100-80GB"}, {"A100-40GB"}, {"A100-40GB", "H100-80GB"}, {"B200"}});
  if (random.Chance(0.1)) spec.min_gpu_memory_mib = 50'000;
  spec.submit_time = random.Int(0, now);
  if (random.Chance(0.7)) spec.runtime_estimate = random.Int(1, 2'000'000);
  spec.preemptible = random.Chance(0.8);
  return spec;
}

SchedulerConfig RandomConfig(Random& random) {
  SchedulerConfig config;
  config.order = random.Pick<QueueOrder>({QueueOrder::kFifo, QueueOrder::kSjf, QueueOrder::kLas});
  config.backfill = random.Pick<Backfill>({Backfill::kNone, Backfill::kEasy, Backfill::kFirstFit});
  config.placement =
      random.Pick<PlacementPolicy>({PlacementPolicy::kBinPack, PlacementPolicy::kSpread});
  config.preempt = random.Chance(0.5);
  config.las_queue_limits_gpu_s = random.Pick<std::vector<int64_t>>({{3200}, {100, 1000}, {50}});
  config.las_starvation_factor = random.Chance(0.3) ? 2.0 : 0.0;
  return config;
}

Case RandomCase(uint64_t seed, int32_t max_nodes, int32_t max_pending) {
  Random random(seed);
  Case c;
  c.cluster = RandomCluster(random, max_nodes);
  c.now = random.Int(1'000'000, 10'000'000);
  c.config = RandomConfig(random);
  // Running jobs are placed on the healthy cluster first; draining nodes and failing GPUs
  // afterwards leaves some running on capacity the scheduler may no longer hand out.
  {
    Allocator allocator(c.cluster);
    const int64_t attempts = random.Int(0, 3 * static_cast<int64_t>(c.cluster.nodes.size()));
    for (int64_t i = 0; i < attempts; ++i) {
      JobSpec spec = RandomSpec(random, static_cast<JobId>(i + 1), c.now);
      const auto policy =
          random.Pick<PlacementPolicy>({PlacementPolicy::kBinPack, PlacementPolicy::kSpread});
      if (auto allocation = allocator.Place(spec, policy)) {
        RunningJob job;
        job.spec = std::move(spec);
        job.allocation = std::move(*allocation);
        job.start_time = random.Int(0, c.now);
        job.attained_gpu_ms = random.Chance(0.5) ? random.Int(0, 10'000'000) : 0;
        c.running.push_back(std::move(job));
      }
    }
  }
  for (Node& node : c.cluster.nodes) {
    if (random.Chance(0.08)) node.schedulable = false;
    for (Gpu& gpu : node.gpus)
      if (random.Chance(0.04)) gpu.healthy = false;
  }
  const int64_t pending = random.Int(0, max_pending);
  for (int64_t i = 0; i < pending; ++i) {
    PendingJob job;
    job.spec = RandomSpec(random, static_cast<JobId>(10'000 + i), c.now);
    if (random.Chance(0.3)) {
      job.attained_gpu_ms = random.Int(1, 10'000'000);
      job.last_run_end = random.Int(job.spec.submit_time, c.now);
      job.preemptions = static_cast<int32_t>(random.Int(1, 3));
    }
    c.pending.push_back(std::move(job));
  }
  // A quarter of the cases place by FGD against the shapes of their own jobs. Drawn from a
  // generator of its own, so that every other part of a case is what it was before FGD existed.
  Random fgd(seed ^ 0xf6d0f6d0f6d0f6d0ULL);
  if (fgd.Chance(0.25)) {
    c.config.placement = PlacementPolicy::kFgd;
    std::vector<JobSpec> shapes;
    for (const RunningJob& job : c.running)
      shapes.push_back(job.spec);
    for (const PendingJob& job : c.pending)
      shapes.push_back(job.spec);
    c.config.target_workload = TargetWorkloadOf(shapes);
  }
  // A fifth order jobs by fair share, the pending ones in three team queues with factors of
  // their own (RandomQuotaCase names its own queues: those get factors too). A generator of its
  // own, as for FGD.
  Random fair(seed ^ 0xfa125ea7fa125ea7ULL);
  if (fair.Chance(0.2)) {
    c.config.order = QueueOrder::kFairShare;
    for (const char* team : {"a", "b", "c", "q0", "q1", "q2", "q3"})
      if (fair.Chance(0.8)) c.config.fair_share_factor[team] = fair.Pick<double>({0.1, 0.5, 0.9});
    for (PendingJob& job : c.pending)
      job.spec.queue = fair.Pick<std::string>({"a", "b", "c"});
  }
  return c;
}

std::string Describe(const Decisions& d) {
  std::ostringstream out;
  for (const Placement& p : d.placements) {
    out << "place " << p.job << ":";
    for (const TaskPlacement& t : p.allocation) {
      out << " n" << t.node << "[";
      for (const GpuShare& s : t.gpus)
        out << s.gpu << "@" << s.milli << " ";
      out << "]";
    }
    out << "\n";
  }
  for (const Preemption& p : d.preemptions)
    out << "preempt " << p.job << " for " << p.for_job << " reason " << static_cast<int>(p.reason)
        << "\n";
  for (const Waiting& w : d.waiting)
    out << "wait " << w.job << " " << WaitReasonCode(w.reason) << "\n";
  return out.str();
}

// The preemption class the scheduler documents: priority, then (LAS only) the attained-service
// queue, with Tiresias' starvation guard for pending jobs. Smaller is better.
std::pair<int64_t, int64_t> ClassOf(const SchedulerConfig& config, const JobSpec& spec,
                                    int64_t attained_gpu_ms, TimeMs waiting_since, TimeMs now) {
  int64_t queue = 0;
  if (config.order == QueueOrder::kLas) {
    for (int64_t limit : config.las_queue_limits_gpu_s)
      if (attained_gpu_ms >= limit * kMsPerSecond) ++queue;
    if (config.las_starvation_factor > 0 && waiting_since >= 0 && spec.gpu_milli_per_task > 0) {
      const double ran_ms = static_cast<double>(attained_gpu_ms) * kMilliPerGpu /
                            static_cast<double>(spec.TotalGpuMilli());
      if (ran_ms > 0 &&
          static_cast<double>(now - waiting_since) >= config.las_starvation_factor * ran_ms)
        queue = 0;
    }
  }
  return {-int64_t{spec.priority}, queue};
}

bool GpuMatches(const Gpu& gpu, const JobSpec& spec) {
  const bool model_ok =
      spec.gpu_models.empty() ||
      std::find(spec.gpu_models.begin(), spec.gpu_models.end(), gpu.model) != spec.gpu_models.end();
  return model_ok && gpu.memory_mib >= spec.min_gpu_memory_mib;
}

// Independent ledger of what is taken, to check the allocator's own accounting against.
struct Ledger {
  explicit Ledger(const Cluster& cluster) : cluster_(cluster) {
    for (const Node& node : cluster.nodes) {
      gpu_used.emplace_back(node.gpus.size(), 0);
      cpu_used.push_back(0);
      memory_used.push_back(0);
    }
  }
  void Add(const JobSpec& spec, const Allocation& allocation, int sign = 1) {
    for (const TaskPlacement& task : allocation) {
      const auto n = static_cast<size_t>(task.node);
      cpu_used[n] += sign * spec.cpu_milli_per_task;
      memory_used[n] += sign * spec.memory_mib_per_task;
      for (const GpuShare& share : task.gpus)
        gpu_used[n][static_cast<size_t>(share.gpu)] += sign * share.milli;
    }
  }
  // Every over-allocation, as text; empty when none.
  std::string Overuse() const {
    std::ostringstream out;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
      const Node& node = cluster_.nodes[n];
      if (cpu_used[n] > node.cpu_milli) out << node.name << " CPU " << cpu_used[n] << "; ";
      if (memory_used[n] > node.memory_mib)
        out << node.name << " memory " << memory_used[n] << "; ";
      for (size_t g = 0; g < node.gpus.size(); ++g)
        if (gpu_used[n][g] > kMilliPerGpu)
          out << node.name << " GPU " << g << " " << gpu_used[n][g] << "; ";
    }
    return out.str();
  }
  // Whether the job fits now, from the ledger alone: enough tasks in all, and with tasks_per_node
  // enough nodes that each hold a group.
  bool Fits(const JobSpec& spec) const {
    if (spec.tasks_per_node == 0) return TasksThatFit(spec) >= spec.tasks;
    int64_t nodes = 0;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n)
      nodes += FitOn(n, spec) >= spec.tasks_per_node ? 1 : 0;
    return nodes >= spec.Nodes();
  }
  // How many tasks of the job fit now, in all and on node n.
  int64_t TasksThatFit(const JobSpec& spec) const {
    int64_t total = 0;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n)
      total += FitOn(n, spec);
    return total;
  }
  int64_t FitOn(size_t n, const JobSpec& spec) const {
    const Node& node = cluster_.nodes[n];
    if (!node.schedulable) return 0;
    int64_t fit = std::numeric_limits<int32_t>::max();
    if (spec.gpu_milli_per_task > 0) {
      fit = 0;
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        const Gpu& gpu = node.gpus[g];
        if (!gpu.healthy || !GpuMatches(gpu, spec)) continue;
        const int64_t free = kMilliPerGpu - gpu_used[n][g];
        if (spec.Fractional()) {
          fit += free / spec.gpu_milli_per_task;
        } else {
          fit += free == kMilliPerGpu ? 1 : 0;
        }
      }
      if (!spec.Fractional()) fit /= spec.WholeGpusPerTask();
    }
    if (spec.cpu_milli_per_task > 0)
      fit = std::min(fit, (node.cpu_milli - cpu_used[n]) / spec.cpu_milli_per_task);
    if (spec.memory_mib_per_task > 0)
      fit = std::min(fit, (node.memory_mib - memory_used[n]) / spec.memory_mib_per_task);
    return std::max<int64_t>(0, fit);
  }
  int64_t FreeUsableGpuMilli() const {
    int64_t free = 0;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
      if (!cluster_.nodes[n].schedulable) continue;
      for (size_t g = 0; g < cluster_.nodes[n].gpus.size(); ++g)
        if (cluster_.nodes[n].gpus[g].healthy) free += kMilliPerGpu - gpu_used[n][g];
    }
    return free;
  }

  const Cluster& cluster_;
  std::vector<std::vector<int64_t>> gpu_used;
  std::vector<int64_t> cpu_used;
  std::vector<int64_t> memory_used;
};

// Checks that a placement has the job's gang shape and only uses GPUs the job may use.
void CheckShape(const Cluster& cluster, const JobSpec& spec, const Allocation& allocation) {
  ASSERT_EQ(static_cast<int32_t>(allocation.size()), spec.tasks) << "job " << spec.id;
  if (spec.tasks_per_node > 0) {
    // Exactly tasks_per_node tasks on each of Nodes() distinct nodes, a node's tasks together.
    std::set<int32_t> nodes;
    for (size_t t = 0; t < allocation.size(); t += static_cast<size_t>(spec.tasks_per_node)) {
      EXPECT_TRUE(nodes.insert(allocation[t].node).second)
          << "job " << spec.id << " uses node " << allocation[t].node << " for two groups";
      for (size_t u = t; u < t + static_cast<size_t>(spec.tasks_per_node); ++u)
        EXPECT_EQ(allocation[u].node, allocation[t].node) << "job " << spec.id << " task " << u;
    }
    EXPECT_EQ(static_cast<int32_t>(nodes.size()), spec.Nodes()) << "job " << spec.id;
  }
  for (const TaskPlacement& task : allocation) {
    ASSERT_GE(task.node, 0);
    ASSERT_LT(task.node, static_cast<int32_t>(cluster.nodes.size()));
    const Node& node = cluster.nodes[static_cast<size_t>(task.node)];
    EXPECT_TRUE(node.schedulable) << "job " << spec.id << " placed on drained " << node.name;
    if (spec.Fractional()) {
      ASSERT_EQ(task.gpus.size(), 1u) << "job " << spec.id;
      EXPECT_EQ(task.gpus[0].milli, spec.gpu_milli_per_task) << "job " << spec.id;
    } else {
      ASSERT_EQ(static_cast<int32_t>(task.gpus.size()), spec.WholeGpusPerTask())
          << "job " << spec.id;
    }
    std::set<int32_t> distinct;
    for (const GpuShare& share : task.gpus) {
      ASSERT_GE(share.gpu, 0);
      ASSERT_LT(share.gpu, static_cast<int32_t>(node.gpus.size()));
      if (!spec.Fractional()) {
        EXPECT_EQ(share.milli, kMilliPerGpu) << "job " << spec.id;
      }
      EXPECT_TRUE(distinct.insert(share.gpu).second) << "job " << spec.id << " repeats a GPU";
      const Gpu& gpu = node.gpus[static_cast<size_t>(share.gpu)];
      EXPECT_TRUE(gpu.healthy) << "job " << spec.id << " on faulty " << node.name << "/"
                               << share.gpu;
      EXPECT_TRUE(GpuMatches(gpu, spec))
          << "job " << spec.id << " on " << gpu.model << " with " << gpu.memory_mib << " MiB";
    }
  }
}

void CheckDecisions(const Case& c, const Decisions& decisions) {
  std::map<JobId, const PendingJob*> pending;
  for (const PendingJob& job : c.pending)
    pending[job.spec.id] = &job;
  std::map<JobId, const RunningJob*> running;
  for (const RunningJob& job : c.running)
    running[job.spec.id] = &job;

  // Every pending job exactly once, placed or waiting.
  std::map<JobId, int> seen;
  std::map<JobId, WaitReason> reasons;
  for (const Placement& p : decisions.placements)
    ++seen[p.job];
  for (const Waiting& w : decisions.waiting) {
    ++seen[w.job];
    reasons[w.job] = w.reason;
  }
  for (const auto& [id, count] : seen) {
    EXPECT_TRUE(pending.count(id)) << "decision about job " << id << ", which is not pending";
    EXPECT_EQ(count, 1) << "job " << id << " decided " << count << " times";
  }
  EXPECT_EQ(seen.size(), pending.size());

  // Preemptions: distinct, of running preemptible jobs, only when allowed, for a placed job of a
  // strictly better class.
  std::set<JobId> preempted;
  for (const Preemption& p : decisions.preemptions) {
    EXPECT_TRUE(c.config.preempt || c.config.order == QueueOrder::kLas);
    EXPECT_TRUE(preempted.insert(p.job).second) << "job " << p.job << " preempted twice";
    ASSERT_TRUE(running.count(p.job)) << "preempted job " << p.job << " is not running";
    const RunningJob& victim = *running[p.job];
    EXPECT_TRUE(victim.spec.preemptible) << "job " << p.job << " is not preemptible";
    ASSERT_TRUE(pending.count(p.for_job));
    EXPECT_TRUE(std::any_of(decisions.placements.begin(), decisions.placements.end(),
                            [&](const Placement& placement) { return placement.job == p.for_job; }))
        << "job " << p.job << " preempted for job " << p.for_job << ", which was not placed";
    const PendingJob& winner = *pending[p.for_job];
    const TimeMs since = winner.last_run_end >= 0 ? winner.last_run_end : winner.spec.submit_time;
    EXPECT_LT(ClassOf(c.config, winner.spec, winner.attained_gpu_ms, since, c.now),
              ClassOf(c.config, victim.spec, victim.attained_gpu_ms, -1, c.now))
        << "job " << p.for_job << " preempted job " << p.job << ", which is not of a worse class";
  }

  // The decisions apply: commit into a fresh allocator (which throws on any over-allocation)
  // and into an independent ledger.
  Allocator allocator(c.cluster);
  Ledger ledger(c.cluster);
  for (const RunningJob& job : c.running) {
    if (preempted.count(job.spec.id)) continue;
    ASSERT_NO_THROW(allocator.Commit(job.spec, job.allocation));
    ledger.Add(job.spec, job.allocation);
  }
  for (const Placement& p : decisions.placements) {
    const JobSpec& spec = pending[p.job]->spec;
    CheckShape(c.cluster, spec, p.allocation);
    EXPECT_NO_THROW(allocator.Commit(spec, p.allocation)) << "job " << p.job;
    ledger.Add(spec, p.allocation);
  }
  EXPECT_EQ(ledger.Overuse(), "");
  EXPECT_EQ(allocator.FreeGpuMilli(), ledger.FreeUsableGpuMilli());

  // Feasibility agrees with CheckFeasible, wherever the job was in the queue.
  for (const PendingJob& job : c.pending) {
    const auto infeasible = CheckFeasible(c.cluster, job.spec);
    const auto reason = reasons.find(job.spec.id);
    if (infeasible) {
      ASSERT_NE(reason, reasons.end()) << "infeasible job " << job.spec.id << " was placed";
      EXPECT_EQ(WaitReasonCode(reason->second), WaitReasonCode(*infeasible))
          << "job " << job.spec.id;
    } else if (reason != reasons.end()) {
      EXPECT_FALSE(IsInfeasible(reason->second))
          << "job " << job.spec.id << " is feasible but waits with "
          << WaitReasonCode(reason->second);
    }
  }

  // Reasons that belong to one backfill mode only.
  for (const auto& [id, reason] : reasons) {
    if (reason == WaitReason::kBlockedByQueueHead) {
      EXPECT_EQ(c.config.backfill, Backfill::kNone) << "job " << id;
    }
    if (reason == WaitReason::kReservedForEarlierJob) {
      EXPECT_EQ(c.config.backfill, Backfill::kEasy) << "job " << id;
    }
  }

  // Without preemption in this cycle free capacity only shrinks, so a job that waits for GPUs,
  // CPU or memory must not fit what is left after the cycle either.
  if (decisions.preemptions.empty()) {
    for (const auto& [id, reason] : reasons) {
      if (reason != WaitReason::kInsufficientGpus && reason != WaitReason::kInsufficientCpuOrMemory)
        continue;
      const JobSpec& spec = pending[id]->spec;
      EXPECT_FALSE(ledger.Fits(spec))
          << "job " << id << " waits with " << WaitReasonCode(reason) << " but fits";
    }
  }

  // Strict FIFO without preemption: a placed job has every job ahead of it placed (or never
  // runnable).
  if (c.config.order == QueueOrder::kFifo && c.config.backfill == Backfill::kNone &&
      !c.config.preempt) {
    for (const Placement& p : decisions.placements) {
      const JobSpec& placed = pending[p.job]->spec;
      for (const auto& [id, reason] : reasons) {
        const JobSpec& other = pending[id]->spec;
        const bool ahead = std::tuple(-other.priority, other.submit_time, other.id) <
                           std::tuple(-placed.priority, placed.submit_time, placed.id);
        EXPECT_FALSE(ahead && !IsInfeasible(reason))
            << "job " << p.job << " started before job " << id << " in strict FIFO";
      }
    }
  }
}

bool SameDecisions(const Decisions& a, const Decisions& b) {
  return Describe(a) == Describe(b);
}

// What the random cases exercised, so that a generator change cannot quietly make the
// properties vacuous (no preemptions, no gangs, no infeasible jobs...).
struct Coverage {
  int64_t placements = 0;
  int64_t gang_placements = 0;
  int64_t fractional_placements = 0;
  int64_t multi_node_gangs = 0;
  int64_t preemptions = 0;
  int64_t las_demotions = 0;
  std::map<std::string, int64_t> waits;

  void Add(const Case& c, const Decisions& d) {
    for (const Placement& p : d.placements) {
      ++placements;
      const auto job = std::find_if(c.pending.begin(), c.pending.end(),
                                    [&](const PendingJob& j) { return j.spec.id == p.job; });
      if (job->spec.tasks > 1) ++gang_placements;
      if (job->spec.Fractional()) ++fractional_placements;
      std::set<int32_t> nodes;
      for (const TaskPlacement& t : p.allocation)
        nodes.insert(t.node);
      if (nodes.size() > 1) ++multi_node_gangs;
    }
    for (const Preemption& p : d.preemptions) {
      ++preemptions;
      if (p.reason == PreemptReason::kLasDemotion) ++las_demotions;
    }
    for (const Waiting& w : d.waiting)
      ++waits[WaitReasonCode(w.reason)];
  }
};

void RunScheduleCase(uint64_t seed, int32_t max_nodes, int32_t max_pending,
                     Coverage* coverage = nullptr) {
  const Case c = RandomCase(seed, max_nodes, max_pending);
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(c.cluster.nodes.size()) +
               " nodes, " + std::to_string(c.running.size()) + " running, " +
               std::to_string(c.pending.size()) + " pending, order " + Name(c.config.order) +
               ", backfill " + Name(c.config.backfill) + ", placement " + Name(c.config.placement) +
               (c.config.preempt ? ", preempt" : ""));
  const Decisions first = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
  CheckDecisions(c, first);
  if (coverage) coverage->Add(c, first);
  const Decisions second = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
  EXPECT_TRUE(SameDecisions(first, second)) << "first:\n"
                                            << Describe(first) << "second:\n"
                                            << Describe(second);
}

TEST(ScheduleProperty, SmallClusters) {
  Coverage coverage;
  for (uint64_t seed = 1; seed <= kScheduleCases; ++seed) {
    RunScheduleCase(seed, 12, 30, &coverage);
    if (HasFailure()) return;  // one seed's report is enough to debug
  }
  // The cases must reach every kind of decision for the properties above to mean anything.
  EXPECT_GT(coverage.placements, 1000);
  EXPECT_GT(coverage.gang_placements, 100);
  EXPECT_GT(coverage.fractional_placements, 100);
  EXPECT_GT(coverage.multi_node_gangs, 20);
  EXPECT_GT(coverage.preemptions, 50);
  EXPECT_GT(coverage.las_demotions, 10);
  for (const char* code :
       {"insufficient_gpus", "insufficient_cpu_or_memory", "blocked_by_queue_head",
        "reserved_for_earlier_job", "infeasible_gpu_count", "infeasible_task_shape",
        "infeasible_gpu_model", "infeasible_node_count"})
    EXPECT_GT(coverage.waits[code], 10) << code;
  std::ostringstream summary;
  summary << coverage.placements << " placements (" << coverage.gang_placements << " gangs, "
          << coverage.multi_node_gangs << " across nodes, " << coverage.fractional_placements
          << " fractional), " << coverage.preemptions << " preemptions (" << coverage.las_demotions
          << " LAS); waits:";
  for (const auto& [code, count] : coverage.waits)
    summary << ' ' << code << '=' << count;
  RecordProperty("coverage", summary.str());
  std::cout << summary.str() << '\n';
}

TEST(ScheduleProperty, LargerClusters) {
  for (uint64_t seed = 100'001; seed < 100'001 + kLargeScheduleCases; ++seed) {
    RunScheduleCase(seed, 64, 200);
    if (HasFailure()) break;
  }
}

TEST(ScheduleProperty, ShuffledQueueGivesTheSameDecisions) {
  // The order is a property of the jobs, not of how the caller happens to list them.
  for (uint64_t seed = 200'001; seed < 200'001 + 100; ++seed) {
    Case c = RandomCase(seed, 12, 30);
    const Decisions ordered = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    std::shuffle(c.pending.begin(), c.pending.end(), std::mt19937_64(seed));
    const Decisions shuffled = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    ASSERT_TRUE(SameDecisions(ordered, shuffled)) << "seed " << seed << "\nordered:\n"
                                                  << Describe(ordered) << "shuffled:\n"
                                                  << Describe(shuffled);
  }
}

// The simulator's fast path (sorted input, early stop) must decide exactly what a full cycle does.
std::string DescribeActions(Decisions d) {
  d.waiting.clear();
  return Describe(d);
}

// The cycle with every hint the simulator gives: the queue sorted, the CPU-only jobs counted, no
// explanations.
// count_per_queue: with the per-queue hints (counts, and each job's queue).
Decisions HintedCycle(const Case& c, bool count_per_queue = true) {
  std::vector<const PendingJob*> sorted;
  for (const PendingJob& job : c.pending)
    sorted.push_back(&job);
  std::sort(sorted.begin(), sorted.end(), [&](const PendingJob* a, const PendingJob* b) {
    return PendingBefore(*a, *b, c.now, c.config);
  });
  CycleOptions options;
  options.pending_sorted = true;
  options.explain_all_waiting = false;
  options.cpu_only_pending =
      std::count_if(c.pending.begin(), c.pending.end(),
                    [](const PendingJob& j) { return j.spec.gpu_milli_per_task == 0; });
  std::vector<int64_t> per_queue(c.config.queues.size(), 0);
  std::vector<int32_t> queue_index;
  for (const PendingJob* job : sorted) {
    queue_index.push_back(-1);
    for (size_t q = 0; q < c.config.queues.size(); ++q)
      if (c.config.queues[q].name == job->spec.queue) {
        ++per_queue[q];
        queue_index.back() = static_cast<int32_t>(q);
      }
  }
  if (count_per_queue) {
    options.pending_per_queue = per_queue;
    options.pending_queue_index = queue_index;
  }
  return Schedule(c.cluster, c.running, sorted, c.now, c.config, options);
}

TEST(ScheduleProperty, HintedCycleDecidesTheSameAsAFullOne) {
  int64_t stopped_early = 0;
  for (uint64_t seed = 400'001; seed < 400'001 + 300; ++seed) {
    Case c = RandomCase(seed, 12, 30);
    const Decisions full = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    const Decisions hinted = HintedCycle(c);
    ASSERT_EQ(DescribeActions(full), DescribeActions(hinted)) << "seed " << seed;
    EXPECT_EQ(full.considered, static_cast<int64_t>(c.pending.size())) << "seed " << seed;
    EXPECT_TRUE(hinted.waiting.empty()) << "seed " << seed;  // no explanations asked for
    if (hinted.considered < static_cast<int64_t>(c.pending.size())) ++stopped_early;
  }
  EXPECT_GT(stopped_early, 30);  // the early stop must actually be exercised
}

// Without explanations a cycle computes no wait reason, checks feasibility only where it decides
// something, and once no job left may preempt passes over jobs asking for more GPUs than are
// free. None of this may change a placement or a preemption, with or without the other hints, on
// queues long enough to reach that point often.
TEST(ScheduleProperty, LazyExplanationsDecideLikeFullOnes) {
  int64_t stopped_early = 0;
  int64_t preemptions = 0;
  for (uint64_t seed = 600'001; seed < 600'001 + 400; ++seed) {
    const Case c = seed % 4 == 0 ? RandomCase(seed, 24, 150) : RandomCase(seed, 6, 60);
    std::vector<const PendingJob*> pending;
    for (const PendingJob& job : c.pending)
      pending.push_back(&job);
    const Decisions full = Schedule(c.cluster, c.running, pending, c.now, c.config, CycleOptions{});
    CycleOptions lazy;
    lazy.explain_all_waiting = false;
    const Decisions unsorted = Schedule(c.cluster, c.running, pending, c.now, c.config, lazy);
    ASSERT_EQ(DescribeActions(full), DescribeActions(unsorted)) << "seed " << seed;
    std::sort(pending.begin(), pending.end(), [&](const PendingJob* a, const PendingJob* b) {
      return PendingBefore(*a, *b, c.now, c.config);
    });
    lazy.pending_sorted = true;
    lazy.cpu_only_pending =
        std::count_if(c.pending.begin(), c.pending.end(),
                      [](const PendingJob& j) { return j.spec.gpu_milli_per_task == 0; });
    const Decisions hinted = Schedule(c.cluster, c.running, pending, c.now, c.config, lazy);
    ASSERT_EQ(DescribeActions(full), DescribeActions(hinted)) << "seed " << seed;
    EXPECT_TRUE(unsorted.waiting.empty() && hinted.waiting.empty()) << "seed " << seed;
    if (hinted.considered < static_cast<int64_t>(c.pending.size())) ++stopped_early;
    preemptions += static_cast<int64_t>(full.preemptions.size());
  }
  EXPECT_GT(stopped_early, 50);
  EXPECT_GT(preemptions, 100);
}

// The pass-over itself: with no job able to preempt, a long run of jobs too big for the free
// GPUs is skipped and the small job behind them still starts; the full cycle agrees.
TEST(ScheduleProperty, LazyCyclePassesOverJobsTooBigForTheFreeGpus) {
  UniformClusterShape shape;
  shape.nodes = 2;
  Case c;
  c.cluster = MakeUniformCluster(shape);
  c.now = 1'000'000;
  c.config.order = QueueOrder::kLas;
  c.config.backfill = Backfill::kFirstFit;
  RunningJob big;  // 14 of 16 GPUs, in the first LAS queue: nobody may preempt it
  big.spec.id = 1;
  big.spec.tasks = 2;
  big.spec.gpu_milli_per_task = 7000;
  big.allocation = {{.node = 0, .gpus = {}}, {.node = 1, .gpus = {}}};
  for (int32_t g = 0; g < 7; ++g) {
    big.allocation[0].gpus.push_back({.gpu = g, .milli = kMilliPerGpu});
    big.allocation[1].gpus.push_back({.gpu = g, .milli = kMilliPerGpu});
  }
  c.running.push_back(big);
  for (JobId id = 10; id < 110; ++id) {
    PendingJob job;
    job.spec.id = id;
    job.spec.submit_time = static_cast<TimeMs>(id);
    job.spec.gpu_milli_per_task = id < 109 ? 4000 : 1000;  // 99 too big, then one that fits
    c.pending.push_back(job);
  }
  std::vector<const PendingJob*> pending;
  for (const PendingJob& job : c.pending)
    pending.push_back(&job);
  CycleOptions lazy;
  lazy.pending_sorted = true;
  lazy.cpu_only_pending = 0;
  lazy.explain_all_waiting = false;
  const Decisions hinted = Schedule(c.cluster, c.running, pending, c.now, c.config, lazy);
  const Decisions full = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
  ASSERT_EQ(hinted.placements.size(), 1u);
  EXPECT_EQ(hinted.placements[0].job, 109u);
  EXPECT_EQ(hinted.considered, 100);
  EXPECT_TRUE(hinted.waiting.empty());
  EXPECT_EQ(DescribeActions(full), DescribeActions(hinted));
  ASSERT_EQ(full.waiting.size(), 99u);
  EXPECT_EQ(full.waiting[0].reason, WaitReason::kInsufficientGpus);
}

// A first-fit cycle with preemption, worked out independently of the scheduler's ranking: jobs
// in queue order; one that does not fit (and could fit the empty cluster) takes victims by the
// documented rule among the running jobs not taken yet: candidates of a strictly worse class,
// worst class first, then most recently started, then highest id; stop once the job fits; give
// back, best first, those it does not need; all or nothing.
Decisions ReferenceFirstFitCycle(const Case& c) {
  Allocator allocator(c.cluster);
  allocator.SetTargetWorkload(c.config.target_workload);  // what FGD placement measures against
  for (const RunningJob& running : c.running)
    allocator.Commit(running.spec, running.allocation);
  std::vector<const PendingJob*> queue;
  for (const PendingJob& job : c.pending)
    queue.push_back(&job);
  std::sort(queue.begin(), queue.end(), [&](const PendingJob* a, const PendingJob* b) {
    return PendingBefore(*a, *b, c.now, c.config);
  });
  auto class_of_running = [&](const RunningJob& job) {
    return ClassOf(c.config, job.spec, job.attained_gpu_ms, -1, c.now);
  };
  Decisions d;
  std::set<JobId> taken;
  for (const PendingJob* job : queue) {
    if (auto allocation = allocator.Place(job->spec, c.config.placement)) {
      d.placements.push_back({job->spec.id, std::move(*allocation)});
      continue;
    }
    if (CheckFeasible(c.cluster, job->spec)) continue;
    const TimeMs since = job->last_run_end >= 0 ? job->last_run_end : job->spec.submit_time;
    const auto cls = ClassOf(c.config, job->spec, job->attained_gpu_ms, since, c.now);
    std::vector<const RunningJob*> candidates;
    for (const RunningJob& running : c.running) {
      if (running.spec.preemptible && !taken.count(running.spec.id) &&
          cls < class_of_running(running))
        candidates.push_back(&running);
    }
    std::sort(candidates.begin(), candidates.end(), [&](const RunningJob* a, const RunningJob* b) {
      return std::tuple(class_of_running(*b), b->start_time, b->spec.id) <
             std::tuple(class_of_running(*a), a->start_time, a->spec.id);
    });
    std::vector<const RunningJob*> released;
    std::optional<Allocation> allocation;
    for (const RunningJob* victim : candidates) {
      allocator.Release(victim->spec, victim->allocation);
      released.push_back(victim);
      if ((allocation = allocator.Place(job->spec, c.config.placement))) break;
    }
    if (!allocation) {
      for (const RunningJob* victim : released)
        allocator.Commit(victim->spec, victim->allocation);
      continue;
    }
    std::vector<const RunningJob*> needed = {released.back()};
    for (size_t k = released.size() - 1; k-- > 0;) {
      const RunningJob* victim = released[k];
      allocator.Release(job->spec, *allocation);
      allocator.Commit(victim->spec, victim->allocation);
      if (auto without = allocator.Place(job->spec, c.config.placement)) {
        allocation = std::move(without);
      } else {
        allocator.Release(victim->spec, victim->allocation);
        allocation = allocator.Place(job->spec, c.config.placement);
        needed.push_back(victim);
      }
    }
    std::sort(needed.begin(), needed.end(),
              [](const RunningJob* a, const RunningJob* b) { return a->spec.id < b->spec.id; });
    for (const RunningJob* victim : needed) {
      taken.insert(victim->spec.id);
      const bool demotion =
          c.config.order == QueueOrder::kLas && victim->spec.priority == job->spec.priority;
      d.preemptions.push_back(
          {victim->spec.id, job->spec.id,
           demotion ? PreemptReason::kLasDemotion : PreemptReason::kHigherPriority});
    }
    d.placements.push_back({job->spec.id, std::move(*allocation)});
  }
  return d;
}

// The cycle ranks running jobs once, for the test whether any preemption is possible, and hands
// those classes to the victim list, which keeps only jobs worse than the first job to try a
// preemption. The victims must be exactly those of the reference above, with and without
// explanations.
TEST(ScheduleProperty, SharedRanksTakeTheReferenceVictims) {
  int64_t preemptions = 0;
  int64_t several = 0;  // cycles where more than one job preempts
  for (uint64_t seed = 700'001; seed < 700'001 + 1500; ++seed) {
    Case c = RandomCase(seed, 8, 6);
    c.config.preempt = true;
    c.config.backfill = Backfill::kFirstFit;
    if (c.config.order == QueueOrder::kLas) c.config.las_queue_limits_gpu_s = {100, 1000};
    for (size_t k = 0; k < c.pending.size(); k += 2)
      c.pending[k].spec.priority = 2;  // more running jobs rank worse
    const Decisions expected = ReferenceFirstFitCycle(c);
    std::vector<const PendingJob*> pending;
    for (const PendingJob& job : c.pending)
      pending.push_back(&job);
    for (const bool explain : {true, false}) {
      CycleOptions options;
      options.explain_all_waiting = explain;
      const Decisions d = Schedule(c.cluster, c.running, pending, c.now, c.config, options);
      ASSERT_EQ(DescribeActions(expected), DescribeActions(d))
          << "seed " << seed << (explain ? "" : " (lazy)");
    }
    preemptions += static_cast<int64_t>(expected.preemptions.size());
    std::set<JobId> preempting;
    for (const Preemption& p : expected.preemptions)
      preempting.insert(p.for_job);
    if (preempting.size() > 1) ++several;
  }
  EXPECT_GT(preemptions, 300);
  EXPECT_GT(several, 30);
}

// ScheduleInPlace decides what Schedule does and leaves the capacity as if the caller had
// released the preempted jobs and committed the placed ones itself, with or without hints.
TEST(ScheduleProperty, InPlaceCycleLeavesItsDecisionsApplied) {
  for (uint64_t seed = 800'001; seed < 800'001 + 300; ++seed) {
    const Case c = RandomCase(seed, 12, 40);
    std::vector<const PendingJob*> pending;
    for (const PendingJob& job : c.pending)
      pending.push_back(&job);
    Allocator capacity(c.cluster);
    for (const RunningJob& job : c.running)
      capacity.Commit(job.spec, job.allocation);
    for (const bool explain : {true, false}) {
      CycleOptions options;
      options.explain_all_waiting = explain;
      const Decisions copied = Schedule(capacity, c.running, pending, c.now, c.config, options);
      Allocator in_place = capacity;
      const Decisions applied =
          ScheduleInPlace(in_place, c.running, pending, c.now, c.config, options);
      ASSERT_EQ(Describe(copied), Describe(applied)) << "seed " << seed;

      Allocator by_hand = capacity;
      std::map<JobId, const JobSpec*> specs;
      for (const RunningJob& job : c.running)
        specs[job.spec.id] = &job.spec;
      for (const PendingJob& job : c.pending)
        specs[job.spec.id] = &job.spec;
      for (const Preemption& p : applied.preemptions) {
        const auto victim = std::find_if(c.running.begin(), c.running.end(),
                                         [&](const RunningJob& j) { return j.spec.id == p.job; });
        by_hand.Release(victim->spec, victim->allocation);
      }
      for (const Placement& p : applied.placements)
        by_hand.Commit(*specs[p.job], p.allocation);
      EXPECT_TRUE(in_place == by_hand) << "seed " << seed << (explain ? "" : " (lazy)");
    }
  }
}

// A caller that keeps one Allocator across cycles (the simulator) must get exactly the decisions
// of a caller that builds it from the snapshot (the server), whatever order jobs came and went in.
TEST(ScheduleProperty, KeptCapacityDecidesLikeAFreshSnapshot) {
  for (uint64_t seed = 500'001; seed < 500'001 + 300; ++seed) {
    Case c = RandomCase(seed, 12, 30);
    std::vector<const PendingJob*> pending;
    for (const PendingJob& job : c.pending)
      pending.push_back(&job);
    const Decisions fresh =
        Schedule(c.cluster, c.running, pending, c.now, c.config, CycleOptions{});

    Allocator capacity(c.cluster);
    std::vector<size_t> order(c.running.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    for (size_t i : order)
      capacity.Commit(c.running[i].spec, c.running[i].allocation);
    // Churn: release half and commit them back in another order.
    const size_t half = order.size() / 2;
    for (size_t k = 0; k < half; ++k)
      capacity.Release(c.running[order[k]].spec, c.running[order[k]].allocation);
    for (size_t k = half; k-- > 0;)
      capacity.Commit(c.running[order[k]].spec, c.running[order[k]].allocation);

    const Decisions kept = Schedule(capacity, c.running, pending, c.now, c.config, CycleOptions{});
    ASSERT_EQ(Describe(fresh), Describe(kept)) << "seed " << seed;
  }
}

// ---- Team queues (SchedulerConfig::queues, docs/quotas.md) ----

// A random case with 1-4 queues in up to two cohorts (some with per-model guarantees and
// borrowing limits), every job in one of them (a few in a queue that does not exist).
Case RandomQuotaCase(uint64_t seed, int32_t max_nodes, int32_t max_pending) {
  Case c = RandomCase(seed, max_nodes, max_pending);
  Random random(seed ^ 0x5eed5eedULL);
  int64_t cluster_milli = 0;
  for (const Node& node : c.cluster.nodes)
    cluster_milli += static_cast<int64_t>(node.gpus.size()) * kMilliPerGpu;
  const int64_t queues = random.Int(1, 4);
  for (int64_t q = 0; q < queues; ++q) {
    QueueConfig queue;
    queue.name = "q" + std::to_string(q);
    queue.cohort = random.Pick<std::string>({"", "c1", "c1", "c2"});
    if (random.Chance(0.25)) {
      for (const std::string& model : kModels)
        if (random.Chance(0.7))
          queue.guaranteed_milli_by_model[model] = random.Int(0, cluster_milli / 2 / 1000) * 1000;
    }
    if (!queue.PerModel()) queue.guaranteed_milli = random.Int(0, cluster_milli / 1000) * 1000 / 2;
    if (random.Chance(0.4)) queue.borrowing_limit_milli = random.Int(0, 8) * 1000;
    c.config.queues.push_back(std::move(queue));
  }
  auto pick_queue = [&]() {
    if (random.Chance(0.05)) return std::string("nope");
    return c.config.queues[static_cast<size_t>(random.Int(0, queues - 1))].name;
  };
  for (RunningJob& job : c.running)
    job.spec.queue = pick_queue();
  for (PendingJob& job : c.pending)
    job.spec.queue = pick_queue();
  return c;
}

// Usage by queue and resource ("" = all models, else a model), as the quota model defines it.
using Usage = std::map<std::pair<std::string, std::string>, int64_t>;

const QueueConfig* FindQueue(const SchedulerConfig& config, const std::string& name) {
  for (const QueueConfig& queue : config.queues)
    if (queue.name == name) return &queue;
  return nullptr;
}

std::map<std::string, int64_t> UsesOf(const Cluster& cluster, const QueueConfig& queue,
                                      const JobSpec& spec, const Allocation& allocation) {
  std::map<std::string, int64_t> uses;
  if (spec.gpu_milli_per_task == 0) return uses;
  if (!queue.PerModel()) {
    uses[""] = spec.TotalGpuMilli();
    return uses;
  }
  for (const TaskPlacement& task : allocation)
    for (const GpuShare& share : task.gpus)
      uses[cluster.nodes[static_cast<size_t>(task.node)]
               .gpus[static_cast<size_t>(share.gpu)]
               .model] += share.milli;
  return uses;
}

int64_t Nominal(const QueueConfig& queue, const std::string& resource) {
  if (resource.empty()) return queue.PerModel() ? 0 : queue.guaranteed_milli;
  auto it = queue.guaranteed_milli_by_model.find(resource);
  return it == queue.guaranteed_milli_by_model.end() ? 0 : it->second;
}

// Replays the decisions in the order the cycle took them (each placement right after the
// preemptions made for it) and checks the quota rules at every step.
void CheckQuotaDecisions(const Case& c, const Decisions& d) {
  std::map<JobId, const PendingJob*> pending;
  for (const PendingJob& job : c.pending)
    pending[job.spec.id] = &job;
  std::map<JobId, const RunningJob*> running;
  for (const RunningJob& job : c.running)
    running[job.spec.id] = &job;

  // Every pending job exactly once.
  std::map<JobId, int> seen;
  for (const Placement& p : d.placements)
    ++seen[p.job];
  for (const Waiting& w : d.waiting)
    ++seen[w.job];
  EXPECT_EQ(seen.size(), pending.size());
  for (const auto& [id, count] : seen)
    EXPECT_EQ(count, 1) << "job " << id;

  // No GPU double-allocated, gangs whole: the decisions commit cleanly, every task placed.
  Allocator allocator(c.cluster);
  std::set<JobId> preempted;
  for (const Preemption& p : d.preemptions) {
    EXPECT_TRUE(preempted.insert(p.job).second) << "job " << p.job << " preempted twice";
    ASSERT_TRUE(running.count(p.job));
    EXPECT_TRUE(running[p.job]->spec.preemptible) << "job " << p.job;
  }
  for (const RunningJob& job : c.running)
    if (!preempted.count(job.spec.id)) {
      ASSERT_NO_THROW(allocator.Commit(job.spec, job.allocation));
    }
  for (const Placement& p : d.placements) {
    ASSERT_TRUE(pending.count(p.job));
    CheckShape(c.cluster, pending[p.job]->spec, p.allocation);
    EXPECT_NO_THROW(allocator.Commit(pending[p.job]->spec, p.allocation)) << "job " << p.job;
  }

  Usage usage;
  auto add = [&](const JobSpec& spec, const Allocation& allocation, int64_t sign) {
    const QueueConfig* queue = FindQueue(c.config, spec.queue);
    if (!queue) return;
    for (const auto& [resource, milli] : UsesOf(c.cluster, *queue, spec, allocation))
      usage[{queue->name, resource}] += sign * milli;
  };
  auto cohort_usage = [&](const std::string& cohort, const std::string& resource) {
    int64_t used = 0, nominal = 0;
    for (const QueueConfig& queue : c.config.queues) {
      if (queue.cohort != cohort) continue;
      used += usage[{queue.name, resource}];
      nominal += Nominal(queue, resource);
    }
    return std::pair(used, nominal);
  };
  for (const RunningJob& job : c.running)
    add(job.spec, job.allocation, +1);

  for (const Placement& p : d.placements) {
    const JobSpec& spec = pending[p.job]->spec;
    const QueueConfig* queue = FindQueue(c.config, spec.queue);
    ASSERT_NE(queue, nullptr) << "job " << p.job << " of an unknown queue was placed";
    bool reclaimed = false;
    for (const Preemption& pre : d.preemptions) {
      if (pre.for_job != p.job) continue;
      const RunningJob& victim = *running[pre.job];
      add(victim.spec, victim.allocation, -1);
      if (pre.reason == PreemptReason::kReclaim) {
        reclaimed = true;
        const QueueConfig* victim_queue = FindQueue(c.config, victim.spec.queue);
        ASSERT_NE(victim_queue, nullptr);
        EXPECT_NE(victim_queue->name, queue->name);
        EXPECT_FALSE(queue->cohort.empty());
        EXPECT_EQ(victim_queue->cohort, queue->cohort) << "reclaim across cohorts";
      } else {
        // Priority preemption stays inside the queue, for a job of a strictly better class.
        EXPECT_EQ(victim.spec.queue, spec.queue) << "job " << p.job << " preempted " << pre.job;
        EXPECT_TRUE(c.config.preempt || c.config.order == QueueOrder::kLas);
        const PendingJob& winner = *pending[p.job];
        const TimeMs since =
            winner.last_run_end >= 0 ? winner.last_run_end : winner.spec.submit_time;
        EXPECT_LT(ClassOf(c.config, winner.spec, winner.attained_gpu_ms, since, c.now),
                  ClassOf(c.config, victim.spec, victim.attained_gpu_ms, -1, c.now));
      }
    }
    // Reclaim victims come from queues borrowing on the reclaiming job's resource, each taken
    // while its queue still borrowed there: with all of them stopped, each victim queue holds
    // more than its guarantee less its largest victim on that resource.
    const auto own_uses = UsesOf(c.cluster, *queue, spec, p.allocation);
    if (reclaimed && own_uses.size() == 1) {
      const std::string& resource = own_uses.begin()->first;
      std::map<std::string, int64_t> largest;  // per victim queue, on `resource`
      for (const Preemption& pre : d.preemptions) {
        if (pre.for_job != p.job || pre.reason != PreemptReason::kReclaim) continue;
        const RunningJob& victim = *running[pre.job];
        const QueueConfig* victim_queue = FindQueue(c.config, victim.spec.queue);
        const auto victim_uses = UsesOf(c.cluster, *victim_queue, victim.spec, victim.allocation);
        const auto on = victim_uses.find(resource);
        ASSERT_TRUE(on != victim_uses.end() && on->second > 0)
            << "reclaim for job " << p.job << " took job " << pre.job
            << ", which frees no quota on '" << resource << "'";
        largest[victim_queue->name] = std::max(largest[victim_queue->name], on->second);
      }
      for (const auto& [name, milli] : largest)
        EXPECT_GT((usage[{name, resource}] + milli), Nominal(*FindQueue(c.config, name), resource))
            << "reclaim for job " << p.job << " took from queue " << name
            << " after it stopped borrowing on '" << resource << "'";
    }
    add(spec, p.allocation, +1);
    const auto uses = UsesOf(c.cluster, *queue, spec, p.allocation);
    EXPECT_LE(uses.size(), 1u) << "job " << p.job << " spans quota resources";
    for (const auto& [resource, milli] : uses) {
      const int64_t used = usage[{queue->name, resource}];
      const int64_t nominal = Nominal(*queue, resource);
      // A reclaim never leaves the reclaiming queue above its guarantee.
      if (reclaimed) {
        EXPECT_LE(used, nominal) << "job " << p.job << " reclaimed above guarantee";
      }
      if (used <= nominal) continue;
      // Above the guarantee only by borrowing: a cohort, within the borrowing limit, within the
      // cohort's guarantees.
      EXPECT_FALSE(queue->cohort.empty()) << "job " << p.job << " took queue " << queue->name
                                          << " above its guarantee without a cohort";
      if (queue->borrowing_limit_milli) {
        EXPECT_LE(used, nominal + *queue->borrowing_limit_milli)
            << "job " << p.job << " took queue " << queue->name << " above its borrowing limit";
      }
      const auto [cohort_used, cohort_nominal] = cohort_usage(queue->cohort, resource);
      EXPECT_LE(cohort_used, cohort_nominal) << "job " << p.job << " overdrew cohort";
    }
  }
  // Jobs of unknown queues wait as such.
  for (const Waiting& w : d.waiting)
    if (!FindQueue(c.config, pending[w.job]->spec.queue)) {
      EXPECT_EQ(w.reason, WaitReason::kUnknownQueue) << "job " << w.job;
    }
}

TEST(QuotaProperty, DecisionsKeepEveryQuotaRule) {
  std::map<PreemptReason, int64_t> preemptions;
  std::map<std::string, int64_t> waits;
  int64_t placements = 0;
  for (uint64_t seed = 900'001; seed < 900'001 + 800; ++seed) {
    const Case c = RandomQuotaCase(seed, 10, 30);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Decisions d = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    CheckQuotaDecisions(c, d);
    if (HasFailure()) return;
    placements += static_cast<int64_t>(d.placements.size());
    for (const Preemption& p : d.preemptions)
      ++preemptions[p.reason];
    for (const Waiting& w : d.waiting)
      ++waits[WaitReasonCode(w.reason)];
  }
  // The cases must reach every rule for the checks above to mean something.
  EXPECT_GT(placements, 1000);
  EXPECT_GT(preemptions[PreemptReason::kReclaim], 20);
  EXPECT_GT(preemptions[PreemptReason::kHigherPriority], 20);
  for (const char* code : {"over_quota", "cohort_exhausted", "unknown_queue", "infeasible_quota"})
    EXPECT_GT(waits[code], 20) << code;
  std::cout << placements << " placements, " << preemptions[PreemptReason::kReclaim]
            << " reclaims, " << preemptions[PreemptReason::kHigherPriority] << " in-queue; waits:";
  for (const auto& [code, count] : waits)
    std::cout << ' ' << code << '=' << count;
  std::cout << '\n';
}

// Every entry point decides the same with queues: the plain overload, pointers with and without
// the sorted hint, a kept capacity, the in-place cycle (which leaves its decisions applied), and
// the lazy cycle without explanations (same placements and preemptions).
TEST(QuotaProperty, EveryEntryPointDecidesTheSame) {
  for (uint64_t seed = 910'001; seed < 910'001 + 300; ++seed) {
    Case c = RandomQuotaCase(seed, 10, 30);
    const Decisions reference = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    std::vector<const PendingJob*> pending;
    for (const PendingJob& job : c.pending)
      pending.push_back(&job);
    std::stable_sort(pending.begin(), pending.end(), [&](const PendingJob* a, const PendingJob* b) {
      return PendingBefore(*a, *b, c.now, c.config);
    });
    Allocator capacity(c.cluster);
    for (const RunningJob& job : c.running)
      capacity.Commit(job.spec, job.allocation);
    CycleOptions sorted;
    sorted.pending_sorted = true;
    ASSERT_EQ(Describe(reference),
              Describe(Schedule(c.cluster, c.running, pending, c.now, c.config, sorted)))
        << "seed " << seed;
    ASSERT_EQ(Describe(reference),
              Describe(Schedule(capacity, c.running, pending, c.now, c.config, CycleOptions{})))
        << "seed " << seed;
    CycleOptions lazy = sorted;
    lazy.explain_all_waiting = false;
    Allocator in_place = capacity;
    const Decisions applied = ScheduleInPlace(in_place, c.running, pending, c.now, c.config, lazy);
    ASSERT_EQ(DescribeActions(reference), DescribeActions(applied)) << "seed " << seed;
    Allocator by_hand = capacity;
    for (const Preemption& p : applied.preemptions)
      for (const RunningJob& job : c.running)
        if (job.spec.id == p.job) by_hand.Release(job.spec, job.allocation);
    for (const Placement& p : applied.placements)
      for (const PendingJob& job : c.pending)
        if (job.spec.id == p.job) by_hand.Commit(job.spec, p.allocation);
    EXPECT_TRUE(in_place == by_hand) << "seed " << seed;
    std::shuffle(c.pending.begin(), c.pending.end(), std::mt19937_64(seed));
    ASSERT_EQ(Describe(reference),
              Describe(Schedule(c.cluster, c.running, c.pending, c.now, c.config)))
        << "seed " << seed << " (shuffled)";
  }
}

// The lazy quota cycle with every hint the simulator gives (sorted queue, CPU-only count, no
// explanations) passes jobs over on their size and stops once nothing more can start: by a
// queue's room to reclaim, the untaken victims' GPUs per queue and class, or every queue blocked
// under strict FIFO. Those bounds must only ever skip jobs that would not start.
TEST(QuotaProperty, LazyCycleWithHintsDecidesTheSame) {
  int64_t stopped_early = 0;
  int64_t stopped_by_count = 0;  // strict FIFO: every queue blocked or without jobs left
  for (uint64_t seed = 920'001; seed < 920'001 + 400; ++seed) {
    Case c = RandomQuotaCase(seed, 8, 60);
    const Decisions full = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    const Decisions hinted = HintedCycle(c);
    ASSERT_EQ(DescribeActions(full), DescribeActions(hinted)) << "seed " << seed;
    if (hinted.considered < static_cast<int64_t>(c.pending.size())) ++stopped_early;
    if (c.config.backfill == Backfill::kNone) {
      const Decisions uncounted = HintedCycle(c, false);
      ASSERT_EQ(DescribeActions(full), DescribeActions(uncounted)) << "seed " << seed;
      if (hinted.considered < uncounted.considered) ++stopped_by_count;
    }
  }
  std::cout << stopped_early << " cycles stopped early, " << stopped_by_count
            << " sooner for the per-queue counts\n";
  EXPECT_GT(stopped_early, 30);  // the early stop must actually be exercised
  EXPECT_GT(stopped_by_count, 10);
}

// The quota cycle ranks every running job each cycle with RunningClassOf instead of RankOf.
TEST(QuotaProperty, RunningClassIsTheRankClass) {
  for (uint64_t seed = 930'001; seed < 930'001 + 200; ++seed) {
    const Case c = RandomCase(seed, 8, 10);
    for (const RunningJob& job : c.running)
      ASSERT_EQ(RunningClassOf(job.spec, job.attained_gpu_ms, c.config),
                RankOf(job.spec, job.attained_gpu_ms, -1, c.now, c.config).cls)
          << "seed " << seed << " job " << job.spec.id;
  }
}

// One queue holding every job with a guarantee above anything it could use has no quota to
// enforce: the quota cycle must then decide exactly what the plain cycle decides, wait reasons
// included. This pins the quota cycle's placement, backfill and preemption to the reference.
TEST(QuotaProperty, OneUnboundedQueueDecidesLikeNoQueues) {
  for (uint64_t seed = 920'001; seed < 920'001 + 600; ++seed) {
    Case c = RandomCase(seed, 12, 30);
    // Renamed before both cycles: fair share ranks jobs by their queue's factor.
    for (RunningJob& job : c.running)
      job.spec.queue = "all";
    for (PendingJob& job : c.pending)
      job.spec.queue = "all";
    const Decisions plain = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    QueueConfig all;
    all.name = "all";
    all.guaranteed_milli = int64_t{1} << 40;
    c.config.queues = {all};
    const Decisions quota = Schedule(c.cluster, c.running, c.pending, c.now, c.config);
    ASSERT_EQ(Describe(plain), Describe(quota))
        << "seed " << seed << ", order " << Name(c.config.order) << ", backfill "
        << Name(c.config.backfill) << (c.config.preempt ? ", preempt" : "");
  }
}

TEST(QuotaProperty, DescribeWaitNamesTheQueueAndTheNumbers) {
  JobSpec spec;
  spec.queue = "vision";
  spec.gpu_milli_per_task = 4000;
  Waiting waiting{.job = 1,
                  .reason = WaitReason::kCohortExhausted,
                  .quota = QuotaWait{.queue = "vision",
                                     .cohort = "research",
                                     .model = "",
                                     .used_milli = 8000,
                                     .ask_milli = 4000,
                                     .guaranteed_milli = 8000,
                                     .borrowing_limit_milli = -1,
                                     .cohort_unused_milli = 2500}};
  EXPECT_EQ(DescribeWait(waiting, spec),
            "waiting for quota: queue 'vision' uses 8 of its 8 guaranteed GPUs and the job asks "
            "4; cohort 'research' has only 2.5 unused guaranteed GPUs to lend");
  waiting.reason = WaitReason::kOverQuota;
  waiting.quota->borrowing_limit_milli = 2000;
  EXPECT_EQ(DescribeWait(waiting, spec),
            "waiting for quota: queue 'vision' uses 8 of its 8 guaranteed GPUs and the job asks "
            "4; it may borrow at most 2 more");
  EXPECT_STREQ(WaitReasonCode(WaitReason::kOverQuota), "over_quota");
  EXPECT_STREQ(PreemptReasonCode(PreemptReason::kReclaim), "reclaim");
  EXPECT_TRUE(IsInfeasible(WaitReason::kUnknownQueue));
}

TEST(AllocatorProperty, PlaceSucceedsExactlyWhenTheJobFits) {
  for (uint64_t seed = 300'001; seed < 300'001 + kAllocatorCases; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Random random(seed);
    Cluster cluster = RandomCluster(random, 10);
    for (Node& node : cluster.nodes) {
      if (random.Chance(0.1)) node.schedulable = false;
      for (Gpu& gpu : node.gpus)
        if (random.Chance(0.05)) gpu.healthy = false;
    }
    Allocator allocator(cluster);
    Ledger ledger(cluster);
    std::vector<std::pair<JobSpec, Allocation>> held;
    for (int step = 0; step < 60; ++step) {
      if (!held.empty() && random.Chance(0.3)) {
        const auto i = static_cast<size_t>(random.Int(0, static_cast<int64_t>(held.size()) - 1));
        allocator.Release(held[i].first, held[i].second);
        ledger.Add(held[i].first, held[i].second, -1);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        const JobSpec spec = RandomSpec(random, static_cast<JobId>(step + 1), 1'000'000);
        const bool fits = ledger.Fits(spec);
        const auto policy =
            random.Pick<PlacementPolicy>({PlacementPolicy::kBinPack, PlacementPolicy::kSpread});
        auto allocation = allocator.Place(spec, policy);
        ASSERT_EQ(allocation.has_value(), fits)
            << "step " << step << ", job asks " << spec.tasks << " x " << spec.gpu_milli_per_task;
        if (allocation) {
          CheckShape(cluster, spec, *allocation);
          ledger.Add(spec, *allocation);
          held.emplace_back(spec, std::move(*allocation));
        }
      }
      ASSERT_EQ(ledger.Overuse(), "") << "step " << step;
      ASSERT_EQ(allocator.FreeGpuMilli(), ledger.FreeUsableGpuMilli()) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace gpufleet::sched
