// Throughput of one scheduling cycle (sched::Schedule) on a 10,000-node, 80,000-GPU cluster.
// Each benchmark builds its inputs once and times whole Schedule calls, which include building
// the allocator's index of the cluster and of the running jobs. Counters are rates over the
// measured time: placements/s is what docs/benchmarks.md compares with the targets
// (>= 50,000 single-GPU placements/s, >= 5,000 64-GPU gang placements/s).
#include <vector>

#include <benchmark/benchmark.h>

#include "core/cluster.h"
#include "sched/allocator.h"
#include "sched/scheduler.h"

namespace gpufleet::sched {
namespace {

constexpr int32_t kNodes = 10'000;
constexpr int32_t kGpusPerNode = 8;
constexpr int64_t kClusterGpus = int64_t{kNodes} * kGpusPerNode;

const Cluster& BigCluster() {
  static const Cluster cluster = [] {
    UniformClusterShape shape;
    shape.nodes = kNodes;
    shape.gpus_per_node = kGpusPerNode;
    shape.nodes_per_rack = 16;
    return MakeUniformCluster(shape);
  }();
  return cluster;
}

std::vector<PendingJob> PendingJobs(int64_t count, int32_t tasks, MilliGpu milli_per_task) {
  std::vector<PendingJob> pending(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    JobSpec& spec = pending[static_cast<size_t>(i)].spec;
    spec.id = static_cast<JobId>(i + 1);
    spec.tasks = tasks;
    spec.gpu_milli_per_task = milli_per_task;
    spec.cpu_milli_per_task = 4'000;
    spec.memory_mib_per_task = 32'768;
    spec.submit_time = i;
    spec.runtime_estimate = 3'600'000;
  }
  return pending;
}

// Runs Schedule on the same inputs each iteration and reports rates. `expected_placements`
// guards against measuring a cycle that went wrong.
void RunCycles(benchmark::State& state, const std::vector<RunningJob>& running,
               const std::vector<PendingJob>& pending, const SchedulerConfig& config, TimeMs now,
               int64_t expected_placements, int64_t expected_preemptions = 0) {
  const Cluster& cluster = BigCluster();  // built before timing starts
  int64_t placements = 0;
  int64_t preemptions = 0;
  for (auto _ : state) {
    const Decisions decisions = Schedule(cluster, running, pending, now, config);
    placements += static_cast<int64_t>(decisions.placements.size());
    preemptions += static_cast<int64_t>(decisions.preemptions.size());
    if (static_cast<int64_t>(decisions.placements.size()) != expected_placements ||
        static_cast<int64_t>(decisions.preemptions.size()) != expected_preemptions) {
      state.SkipWithError("unexpected number of placements or preemptions");
      return;
    }
    benchmark::DoNotOptimize(decisions.placements.data());
  }
  state.counters["placements/s"] =
      benchmark::Counter(static_cast<double>(placements), benchmark::Counter::kIsRate);
  state.counters["placements"] = static_cast<double>(expected_placements);
  if (expected_preemptions > 0) {
    state.counters["preemptions/s"] =
        benchmark::Counter(static_cast<double>(preemptions), benchmark::Counter::kIsRate);
    state.counters["preemptions"] = static_cast<double>(expected_preemptions);
  }
}

PlacementPolicy PolicyArg(const benchmark::State& state) {
  return state.range(0) == 0 ? PlacementPolicy::kBinPack : PlacementPolicy::kSpread;
}

// 100,000 pending 1-GPU jobs on an empty cluster: 80,000 start, the rest wait.
void BM_SingleGpuJobs(benchmark::State& state) {
  const std::vector<PendingJob> pending = PendingJobs(100'000, 1, kMilliPerGpu);
  SchedulerConfig config;
  config.placement = PolicyArg(state);
  RunCycles(state, {}, pending, config, 0, kClusterGpus);
}
BENCHMARK(BM_SingleGpuJobs)->ArgName("spread")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// 2,000 pending gangs of 8 tasks x 8 GPUs (64 GPUs each): 1,250 fill the cluster.
void BM_GangJobs(benchmark::State& state) {
  const std::vector<PendingJob> pending = PendingJobs(2'000, 8, 8 * kMilliPerGpu);
  SchedulerConfig config;
  config.placement = PolicyArg(state);
  config.backfill = Backfill::kFirstFit;  // every gang past the 1,250th is tried and refused
  RunCycles(state, {}, pending, config, 0, kClusterGpus / 64);
}
BENCHMARK(BM_GangJobs)->ArgName("spread")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// 100,000 pending half-GPU jobs: two share each GPU; 160,000 shares exist, so all start.
void BM_FractionalJobs(benchmark::State& state) {
  const std::vector<PendingJob> pending = PendingJobs(100'000, 1, kMilliPerGpu / 2);
  SchedulerConfig config;
  config.placement = PolicyArg(state);
  RunCycles(state, {}, pending, config, 0, 100'000);
}
BENCHMARK(BM_FractionalJobs)->ArgName("spread")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// A LAS cycle on a full cluster: 80,000 running 1-GPU jobs, half of them past the first queue
// limit; 10,000 new 1-GPU jobs arrive in queue 0 and each preempts one demoted job. With EASY
// backfill a demoted 8-GPU job that has no one to preempt also waits at the end of the queue and
// gets the reservation, which is computed over all running jobs.
void BM_LasCycleWithPreemption(benchmark::State& state) {
  const Cluster& cluster = BigCluster();
  SchedulerConfig config;
  config.order = QueueOrder::kLas;
  config.backfill = state.range(0) == 0 ? Backfill::kFirstFit : Backfill::kEasy;
  config.las_queue_limits_gpu_s = {3200};
  const TimeMs now = 10'000'000;

  std::vector<RunningJob> running;
  running.reserve(static_cast<size_t>(kClusterGpus));
  Allocator allocator(cluster);
  const std::vector<PendingJob> to_start = PendingJobs(kClusterGpus, 1, kMilliPerGpu);
  for (size_t i = 0; i < to_start.size(); ++i) {
    RunningJob job;
    job.spec = to_start[i].spec;
    job.spec.id += 1'000'000;
    job.allocation = *allocator.Place(job.spec, PlacementPolicy::kBinPack);
    job.start_time = static_cast<TimeMs>(i);
    job.attained_gpu_ms = (i % 2 == 0) ? 5'000'000 : 1'000'000;  // queue 1 : queue 0
    running.push_back(std::move(job));
  }
  std::vector<PendingJob> pending = PendingJobs(10'000, 1, kMilliPerGpu);
  for (PendingJob& job : pending)
    job.spec.submit_time = now - 1000;
  if (config.backfill == Backfill::kEasy) {
    PendingJob demoted = PendingJobs(1, 1, 8 * kMilliPerGpu)[0];
    demoted.spec.id = 2'000'000;
    demoted.attained_gpu_ms = 5'000'000;
    demoted.last_run_end = now - 1000;
    pending.push_back(demoted);
  }
  RunCycles(state, running, pending, config, now, 10'000, 10'000);
}
BENCHMARK(BM_LasCycleWithPreemption)
    ->ArgName("easy")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpufleet::sched

BENCHMARK_MAIN();
