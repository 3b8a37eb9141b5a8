#include "sim/simulator.h"

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sched/scheduler.h"
#include "sim/report.h"
#include "sim/trace_readers.h"

namespace gpufleet::sim {
namespace {

constexpr TimeMs kSec = kMsPerSecond;

TraceJob Job(JobId id, double submit_s, double duration_s, int32_t gpus, int32_t priority = 0) {
  TraceJob job;
  job.spec.id = id;
  job.spec.name = "job-" + std::to_string(id);
  job.spec.tasks = 1;
  job.spec.gpu_milli_per_task = gpus * kMilliPerGpu;
  job.spec.priority = priority;
  job.spec.submit_time = static_cast<TimeMs>(submit_s * kSec);
  job.duration = static_cast<TimeMs>(duration_s * kSec);
  job.trace_id = job.spec.name;
  job.line = static_cast<int64_t>(id) + 2;  // after a header line
  return job;
}

Trace MakeTrace(std::vector<TraceJob> jobs) {
  Trace trace;
  trace.source = "test.csv";
  trace.jobs = std::move(jobs);
  return trace;
}

Cluster OneNode(int32_t gpus) {
  UniformClusterShape shape;
  shape.nodes = 1;
  shape.gpus_per_node = gpus;
  shape.gpus_per_nvlink_island = gpus;
  return MakeUniformCluster(shape);
}

sched::SchedulerConfig Config(sched::QueueOrder order, sched::Backfill backfill) {
  sched::SchedulerConfig config;
  config.order = order;
  config.backfill = backfill;
  return config;
}

SimOptions Options(Estimates estimates = Estimates::kNone, TimeMs restart_cost = 30 * kSec) {
  SimOptions options;
  options.estimates = estimates;
  options.restart_cost_ms = restart_cost;
  options.max_time_series_points = 0;  // keep every point
  return options;
}

TimeMs Jct(const SimResult& result, size_t job) {
  return result.jobs.at(job).finish - result.jobs.at(job).submit_time;
}

// 1 node x 4 GPUs. A (2 GPUs, 100 s) at 0, B (4 GPUs, 50 s) at 10, C (2 GPUs, 10 s) at 20.
Trace ThreeJobs() {
  return MakeTrace({Job(0, 0, 100, 2), Job(1, 10, 50, 4), Job(2, 20, 10, 2)});
}

TEST(Replay, StrictFifoKeepsTheShortJobBehindTheWideOne) {
  const SimResult result = Simulate(
      OneNode(4), ThreeJobs(), Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  // A 0-100; B waits for all 4 GPUs, 100-150; C blocked behind B although 2 GPUs are free, 150-160.
  EXPECT_EQ(Jct(result, 0), 100 * kSec);
  EXPECT_EQ(Jct(result, 1), 140 * kSec);
  EXPECT_EQ(Jct(result, 2), 140 * kSec);
  EXPECT_EQ(result.jobs[1].first_start, 100 * kSec);
  EXPECT_EQ(result.jobs[2].first_start, 150 * kSec);
  EXPECT_EQ(result.first_submit, 0);
  EXPECT_EQ(result.last_finish, 160 * kSec);
  // 2x100 + 4x50 + 2x10 GPU-s.
  EXPECT_DOUBLE_EQ(result.allocated_gpu_milli_ms, 420.0 * kMilliPerGpu * kSec);
  // Cycles at 0, 10, 20, 100 and 150; the last completion leaves nothing to schedule.
  EXPECT_EQ(result.scheduling_cycles, 5);
  EXPECT_EQ(result.preemptions, 0);

  const SimReport report = MakeReport(result, {});
  EXPECT_NEAR(report.jct_mean_s, 380.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(report.makespan_s, 160);
  EXPECT_DOUBLE_EQ(report.mean_gpu_allocation, 420.0 / (4 * 160));
}

TEST(Replay, SjfWithOracleRunsTheShortJobInTheGap) {
  const SimResult result =
      Simulate(OneNode(4), ThreeJobs(), Config(sched::QueueOrder::kSjf, sched::Backfill::kFirstFit),
               Options(Estimates::kOracle));
  EXPECT_EQ(Jct(result, 0), 100 * kSec);
  EXPECT_EQ(Jct(result, 1), 140 * kSec);
  EXPECT_EQ(Jct(result, 2), 10 * kSec);  // starts at 20 on the two free GPUs
  EXPECT_EQ(result.last_finish, 150 * kSec);
  const SimReport report = MakeReport(result, {});
  EXPECT_NEAR(report.jct_mean_s, 250.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(report.mean_gpu_allocation, 420.0 / (4 * 150));
}

TEST(Replay, EasyBackfillNeedsTheOracleToBackfill) {
  // C (10 s) ends before A frees the GPUs B is reserved on, so EASY lets it jump ahead.
  const SimResult result =
      Simulate(OneNode(4), ThreeJobs(), Config(sched::QueueOrder::kFifo, sched::Backfill::kEasy),
               Options(Estimates::kOracle));
  EXPECT_EQ(Jct(result, 2), 10 * kSec);
  EXPECT_EQ(result.jobs[1].first_start, 100 * kSec);  // the reservation held
}

TEST(Replay, CompletionsAtAnArrivalInstantFreeGpusFirst) {
  // B arrives exactly when A ends; it must start at once on A's GPUs.
  const SimResult result =
      Simulate(OneNode(4), MakeTrace({Job(0, 0, 100, 4), Job(1, 100, 10, 4)}),
               Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  EXPECT_EQ(result.jobs[1].first_start, 100 * kSec);
  EXPECT_EQ(Jct(result, 1), 10 * kSec);
  EXPECT_EQ(result.scheduling_cycles, 2);  // at 0 and at 100, once each
}

TEST(Replay, LasPreemptsTheLongJobForANewShortOneAndChargesTheRestart) {
  // 1 GPU. L (1000 s) passes the 100 GPU-s limit at 100 s; S (50 s) arrives at 200 in the first
  // queue and preempts it. L keeps its 200 s of progress, pays 30 s and resumes when S ends.
  sched::SchedulerConfig config = Config(sched::QueueOrder::kLas, sched::Backfill::kFirstFit);
  config.las_queue_limits_gpu_s = {100};
  const Trace trace = MakeTrace({Job(0, 0, 1000, 1), Job(1, 200, 50, 1)});
  const SimResult result = Simulate(OneNode(1), trace, config, Options());
  EXPECT_EQ(Jct(result, 1), 50 * kSec);
  EXPECT_EQ(Jct(result, 0), (250 + 800 + 30) * kSec);
  EXPECT_EQ(result.jobs[0].preemptions, 1);
  EXPECT_EQ(result.jobs[0].first_start, 0);
  EXPECT_EQ(result.preemptions, 1);

  const SimResult free_restart = Simulate(OneNode(1), trace, config, Options(Estimates::kNone, 0));
  EXPECT_EQ(Jct(free_restart, 0), (250 + 800) * kSec);
}

TEST(Replay, AGracePeriodDelaysTheJobPlacedOnTheGpusAPreemptionFreed) {
  // As above, with a 20 s grace period: L checkpoints for 20 s on its GPU, so S ends at 270
  // instead of 250 and L, resumed when S ends, finishes 20 s later too.
  sched::SchedulerConfig config = Config(sched::QueueOrder::kLas, sched::Backfill::kFirstFit);
  config.las_queue_limits_gpu_s = {100};
  const Trace trace = MakeTrace({Job(0, 0, 1000, 1), Job(1, 200, 50, 1)});
  SimOptions options = Options();
  options.grace_period_ms = 20 * kSec;
  const SimResult result = Simulate(OneNode(1), trace, config, options);
  EXPECT_EQ(Jct(result, 1), (20 + 50) * kSec);
  EXPECT_EQ(Jct(result, 0), (270 + 800 + 30) * kSec);

  // A job placed on GPUs nobody was preempted from is not delayed: on 2 GPUs nothing preempts.
  const SimResult roomy = Simulate(OneNode(2), trace, config, options);
  EXPECT_EQ(Jct(roomy, 1), 50 * kSec);
  EXPECT_EQ(roomy.preemptions, 0);
}

TEST(Replay, LasDemotionCheckPreemptsWithoutAnyOtherEvent) {
  // S arrives at 50 while L is still in the first queue: same class, S waits. Nothing else
  // happens until L's service passes 100 GPU-s at 100.001 s; only the demotion check lets S in.
  sched::SchedulerConfig config = Config(sched::QueueOrder::kLas, sched::Backfill::kFirstFit);
  config.las_queue_limits_gpu_s = {100};
  const SimResult result =
      Simulate(OneNode(1), MakeTrace({Job(0, 0, 1000, 1), Job(1, 50, 50, 1)}), config, Options());
  EXPECT_EQ(result.jobs[1].first_start, 100 * kSec + 1);
  EXPECT_EQ(Jct(result, 1), 100 * kSec + 1);
  // L ran 100.001 s, needs 899.999 more plus the 30 s restart, from 150.001.
  EXPECT_EQ(result.jobs[0].finish, 1080 * kSec);
  EXPECT_EQ(result.preemptions, 1);
}

TEST(Replay, LasDemotionScalesWithGangSize) {
  // A 4-GPU job passes 100 GPU-s after 25 s of wall time.
  sched::SchedulerConfig config = Config(sched::QueueOrder::kLas, sched::Backfill::kFirstFit);
  config.las_queue_limits_gpu_s = {100};
  const SimResult result =
      Simulate(OneNode(4), MakeTrace({Job(0, 0, 1000, 4), Job(1, 10, 50, 4)}), config, Options());
  EXPECT_EQ(result.jobs[1].first_start, 25 * kSec + 1);
}

TEST(Replay, PriorityPreemptionUnderFifo) {
  sched::SchedulerConfig config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
  config.preempt = true;
  // Low-priority L (2 GPUs, 100 s) at 0; high-priority H (2 GPUs, 10 s) at 40 on a 2-GPU node.
  const SimResult result =
      Simulate(OneNode(2), MakeTrace({Job(0, 0, 100, 2, 0), Job(1, 40, 10, 2, 5)}), config,
               Options(Estimates::kNone, 5 * kSec));
  EXPECT_EQ(result.jobs[1].first_start, 40 * kSec);
  EXPECT_EQ(result.jobs[0].finish, (50 + 60 + 5) * kSec);
  EXPECT_EQ(result.preemptions, 1);

  config.preempt = false;
  const SimResult no_preempt = Simulate(
      OneNode(2), MakeTrace({Job(0, 0, 100, 2, 0), Job(1, 40, 10, 2, 5)}), config, Options());
  EXPECT_EQ(no_preempt.jobs[1].first_start, 100 * kSec);
  EXPECT_EQ(no_preempt.preemptions, 0);
}

TEST(Replay, ZeroDurationJobsFinishAtSubmit) {
  const SimResult result =
      Simulate(OneNode(1), MakeTrace({Job(0, 5, 0, 1), Job(1, 5, 20, 1)}),
               Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  EXPECT_EQ(Jct(result, 0), 0);
  EXPECT_EQ(result.jobs[1].first_start, 5 * kSec);
  EXPECT_EQ(Jct(result, 1), 20 * kSec);
}

TEST(Replay, TimeSeriesRecordsEveryChange) {
  const SimResult result = Simulate(
      OneNode(4), ThreeJobs(), Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  const std::vector<TimeSeriesPoint> expected = {{0, 0, 2},          {10 * kSec, 1, 2},
                                                 {20 * kSec, 2, 2},  {100 * kSec, 1, 4},
                                                 {150 * kSec, 0, 2}, {160 * kSec, 0, 0}};
  ASSERT_EQ(result.time_series.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(result.time_series[i].time, expected[i].time) << i;
    EXPECT_EQ(result.time_series[i].queue_length, expected[i].queue_length) << i;
    EXPECT_EQ(result.time_series[i].allocated_gpus, expected[i].allocated_gpus) << i;
  }
}

TEST(Replay, InfeasibleJobIsAnErrorNotAHang) {
  // 8 GPUs on a 4-GPU cluster: RemoveInfeasibleJobs names the line...
  Trace trace = MakeTrace({Job(0, 0, 10, 1), Job(1, 1, 10, 8)});
  try {
    RemoveInfeasibleJobs(OneNode(4), trace, false);
    FAIL() << "expected a TraceError";
  } catch (const TraceError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("test.csv:3: ", 0), 0u) << error.what();
    EXPECT_NE(std::string(error.what()).find("job-1"), std::string::npos) << error.what();
  }
  // ...and the simulator refuses to spin when such a job reaches it anyway, saying why it waits
  // (cycles run without explanations; the run asks for one only now), with and without hints.
  for (const bool hints : {true, false}) {
    SimOptions options = Options();
    options.cycle_hints = hints;
    try {
      Simulate(OneNode(4), trace, Config(sched::QueueOrder::kFifo, sched::Backfill::kNone),
               options);
      FAIL() << "expected a SimError";
    } catch (const SimError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("line 3 (job-1) waits because: "), std::string::npos) << message;
      EXPECT_NE(message.find(sched::DescribeWait(sched::WaitReason::kInfeasibleGpuCount,
                                                 trace.jobs[1].spec)),
                std::string::npos)
          << message;
    }
  }
  // Skipping counts it and keeps the rest.
  Trace skipped = trace;
  EXPECT_EQ(RemoveInfeasibleJobs(OneNode(4), skipped, true), 1);
  ASSERT_EQ(skipped.jobs.size(), 1u);
  EXPECT_EQ(skipped.jobs[0].trace_id, "job-0");
  ASSERT_EQ(skipped.skip_examples.size(), 1u);
  const SimResult result = Simulate(
      OneNode(4), skipped, Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  EXPECT_EQ(result.jobs_total, 1);
  EXPECT_EQ(result.jobs[0].finish, 10 * kSec);
}

TEST(Replay, UnsortedTraceIsRejected) {
  EXPECT_THROW(Simulate(OneNode(4), MakeTrace({Job(0, 10, 1, 1), Job(1, 5, 1, 1)}),
                        Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options()),
               SimError);
}

TEST(Replay, EmptyTrace) {
  const SimResult result =
      Simulate(OneNode(4), MakeTrace({}), Config(sched::QueueOrder::kFifo, sched::Backfill::kNone),
               Options());
  EXPECT_EQ(result.jobs_total, 0);
  EXPECT_EQ(result.scheduling_cycles, 0);
}

TEST(Load, OfferedLoadAndScaling) {
  // 2 GPUs x 100 s + 4 GPUs x 50 s = 400 GPU-s over a 20 s submit span on 4 GPUs: load 5.
  Trace trace = MakeTrace({Job(0, 0, 100, 2), Job(1, 10, 50, 4), Job(2, 20, 0, 1)});
  EXPECT_DOUBLE_EQ(OfferedLoad(trace, 4), 400.0 / (4 * 20));
  ScaleSubmitTimes(trace, 2.5);
  EXPECT_EQ(trace.jobs[0].spec.submit_time, 0);
  EXPECT_EQ(trace.jobs[1].spec.submit_time, 25 * kSec);
  EXPECT_EQ(trace.jobs[2].spec.submit_time, 50 * kSec);
  EXPECT_DOUBLE_EQ(OfferedLoad(trace, 4), 2);
  EXPECT_EQ(OfferedLoad(MakeTrace({Job(0, 0, 10, 1)}), 4), 0);
}

TEST(Downsample, TimeWeightedBucketAverages) {
  // Queue 0 on [0,10), 10 on [10,40); allocation 1 then 3; end at 40.
  const std::vector<TimeSeriesPoint> series = {{0, 0, 1}, {10, 10, 3}, {20, 10, 3}, {40, 0, 0}};
  const std::vector<TimeSeriesPoint> out = Downsample(series, 40, 3);
  // Two buckets [0,20) and [20,40), then the end state.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].time, 0);
  EXPECT_DOUBLE_EQ(out[0].queue_length, 5);
  EXPECT_DOUBLE_EQ(out[0].allocated_gpus, 2);
  EXPECT_EQ(out[1].time, 20);
  EXPECT_DOUBLE_EQ(out[1].queue_length, 10);
  EXPECT_DOUBLE_EQ(out[1].allocated_gpus, 3);
  EXPECT_EQ(out[2].time, 40);
  EXPECT_DOUBLE_EQ(out[2].allocated_gpus, 0);
  EXPECT_EQ(Downsample(series, 40, 10).size(), series.size());
}

TEST(Replay, TimeSeriesIsCappedForLongRuns) {
  std::vector<TraceJob> jobs;
  for (JobId i = 0; i < 500; ++i)
    jobs.push_back(Job(i, static_cast<double>(i) * 7, 11, 1));
  SimOptions options = Options();
  options.max_time_series_points = 50;
  const SimResult result =
      Simulate(OneNode(2), MakeTrace(std::move(jobs)),
               Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), options);
  EXPECT_EQ(result.time_series.size(), 50u);
  EXPECT_EQ(result.time_series.back().time, result.last_finish);
  for (const JobOutcome& job : result.jobs)
    EXPECT_GE(job.finish, 0);
}

// Fill mode on one node with 2 GPUs and 10 CPUs. Pods: C (CPU-only, 5 CPUs), F (0.4 GPU), W (1
// GPU). Pass 1 places all three. Pass 2: C no longer fits (CPU-only: counted, go on), F shares the
// GPU F left partly free, W finds no whole GPU: stop there with 0.2 GPU unallocated.
TEST(Fill, StopsAtTheFirstGpuPodThatDoesNotFit) {
  Cluster cluster = OneNode(2);
  cluster.nodes[0].cpu_milli = 10'000;
  auto pod = [](JobId id, MilliCpu cpu, MilliGpu gpu) {
    TraceJob job;
    job.spec.id = id;
    job.spec.cpu_milli_per_task = cpu;
    job.spec.gpu_milli_per_task = gpu;
    job.trace_id = "pod-" + std::to_string(id);
    job.line = static_cast<int64_t>(id) + 2;
    return job;
  };
  const Trace trace = MakeTrace({pod(0, 5000, 0), pod(1, 500, 400), pod(2, 500, 1000)});
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  for (FillEngine engine : {FillEngine::kAllocator, FillEngine::kSchedule}) {
    options.fill_engine = engine;
    const SimResult result =
        Simulate(cluster, trace, Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), options);
    EXPECT_EQ(result.mode, SimMode::kFill);
    EXPECT_EQ(result.fill.passes, 2);
    EXPECT_EQ(result.fill.pods_placed, 4);
    EXPECT_EQ(result.fill.gpu_pods_placed, 3);
    EXPECT_EQ(result.fill.cpu_only_pods_failed, 1);
    EXPECT_EQ(result.fill.allocated_gpu_milli, 1800);
    ASSERT_TRUE(result.fill.stop.has_value());
    EXPECT_EQ(result.fill.stop->trace_id, "pod-2");
    EXPECT_EQ(result.fill.stop->line, 4);
    EXPECT_EQ(result.fill.stop->reason, sched::WaitReason::kInsufficientGpus);

    const SimReport report = MakeReport(result, {});
    EXPECT_DOUBLE_EQ(report.allocated_gpus, 1.8);
    EXPECT_NEAR(report.unallocated_gpus, 0.2, 1e-12);
    EXPECT_NEAR(report.unallocated_fraction, 0.1, 1e-12);
  }
}

TEST(Fill, CpuOnlyListRunsOnePass) {
  Cluster cluster = OneNode(1);
  cluster.nodes[0].cpu_milli = 1000;
  TraceJob job;
  job.spec.cpu_milli_per_task = 600;
  job.spec.gpu_milli_per_task = 0;
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  const SimResult result =
      Simulate(cluster, MakeTrace({job, job}),
               Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), options);
  EXPECT_EQ(result.fill.passes, 1);
  EXPECT_EQ(result.fill.pods_placed, 1);
  EXPECT_EQ(result.fill.cpu_only_pods_failed, 1);
  EXPECT_FALSE(result.fill.stop.has_value());
}

TEST(Fill, PodsGoInFileOrderNotSubmitOrder) {
  // One GPU; the trace lists B first (earlier submit) but A comes first in the file.
  TraceJob a = Job(0, 5, 0, 1);
  a.trace_id = "pod-a";
  a.line = 2;
  TraceJob b = Job(1, 0, 0, 1);
  b.trace_id = "pod-b";
  b.line = 3;
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  for (FillEngine engine : {FillEngine::kAllocator, FillEngine::kSchedule}) {
    options.fill_engine = engine;
    const SimResult result =
        Simulate(OneNode(1), MakeTrace({b, a}),
                 Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), options);
    ASSERT_TRUE(result.fill.stop.has_value());
    EXPECT_EQ(result.fill.stop->trace_id, "pod-b");
    EXPECT_EQ(result.fill.pods_placed, 1);
  }
}

// Fill under the paper's stopping rule: pods that do not fit are skipped, and the run ends once
// the arrived pods asked for the given share of the GPUs.
TEST(Fill, ArrivedRuleSkipsFailuresAndStopsAtTheArrivedShare) {
  Cluster cluster = OneNode(2);
  auto pod = [](JobId id, MilliGpu gpu) {
    TraceJob job;
    job.spec.id = id;
    job.spec.gpu_milli_per_task = gpu;
    job.trace_id = "pod-" + std::to_string(id);
    job.line = static_cast<int64_t>(id) + 2;
    return job;
  };
  // 1 GPU, then 2 GPUs (does not fit next to it), then 0.5: 3.5 GPUs arrive per pass.
  const Trace trace = MakeTrace({pod(0, 1000), pod(1, 2000), pod(2, 500)});
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  options.fill_arrived = 1.5;  // 3 GPUs: after the second pod
  const auto config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
  SimResult result = Simulate(cluster, trace, config, options);
  EXPECT_EQ(result.fill.pods_placed, 1);
  EXPECT_EQ(result.fill.gpu_pods_failed, 1);
  EXPECT_EQ(result.fill.arrived_gpu_milli, 3000);
  ASSERT_TRUE(result.fill.stop.has_value());
  EXPECT_EQ(result.fill.stop->trace_id, "pod-1");  // the first failure, not where it stopped
  // 5 GPUs: into the second pass, where pod 0 (0.5 GPU left) fails and brings 4.5 GPUs, short of
  // 5, so pod 1 is tried (and fails) too; the pod that reaches the share is the last one.
  options.fill_arrived = 2.5;
  result = Simulate(cluster, trace, config, options);
  EXPECT_EQ(result.fill.passes, 2);
  EXPECT_EQ(result.fill.pods_placed, 2);
  EXPECT_EQ(result.fill.gpu_pods_failed, 3);
  EXPECT_EQ(result.fill.allocated_gpu_milli, 1500);
  EXPECT_EQ(result.fill.arrived_gpu_milli, 6500);
}

TEST(Fill, ShuffleIsDeterministicPerSeed) {
  Cluster cluster = OneNode(8);
  std::vector<TraceJob> jobs;
  for (JobId id = 0; id < 40; ++id) {
    TraceJob job = Job(id, 0, 0, 1);
    job.spec.gpu_milli_per_task = 100 + static_cast<MilliGpu>(id) * 20;
    job.line = id + 2;
    jobs.push_back(job);
  }
  const Trace trace = MakeTrace(jobs);
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  const auto config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
  const SimResult in_order = Simulate(cluster, trace, config, options);
  options.fill_shuffle_seed = 7;
  const SimResult a = Simulate(cluster, trace, config, options);
  const SimResult b = Simulate(cluster, trace, config, options);
  ASSERT_TRUE(a.fill.stop && b.fill.stop && in_order.fill.stop);
  EXPECT_EQ(a.fill.stop->line, b.fill.stop->line);
  EXPECT_EQ(a.fill.allocated_gpu_milli, b.fill.allocated_gpu_milli);
  EXPECT_NE(a.fill.stop->line, in_order.fill.stop->line);
}

// FGD in fill mode takes the trace's own task distribution when the config has none, weighed as
// SimOptions::fgd_weight says.
TEST(Fill, FgdTargetWorkloadDefaultsToTheTrace) {
  const std::string dir = std::string(GPUFLEET_TRACES_DIR) + "/alibaba-gpu-v2023";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  Cluster cluster = ReadAlibabaNodes(dir + "/openb_node_list_gpu_node.csv", 16, 8);
  cluster.nodes.resize(120);
  Trace trace =
      ReadTrace(dir + "/openb_pod_list_gpushare60.csv", TraceFormat::kAlibabaPods, ReadOptions{});
  RemoveInfeasibleJobs(cluster, trace, true);
  sched::SchedulerConfig config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
  config.placement = sched::PlacementPolicy::kFgd;
  SimOptions options = Options();
  options.mode = SimMode::kFill;
  const SimResult implicit = Simulate(cluster, trace, config, options);
  config.target_workload = TargetWorkloadOf(trace, options.fgd_weight);
  const SimResult given = Simulate(cluster, trace, config, options);
  EXPECT_EQ(implicit.fill.allocated_gpu_milli, given.fill.allocated_gpu_milli);
  EXPECT_EQ(implicit.fill.pods_placed, given.fill.pods_placed);
  // Another distribution (only whole 8-GPU tasks) places differently.
  sched::TaskClass eight;
  eight.gpu_milli_per_task = 8000;
  config.target_workload = {eight};
  const SimResult other = Simulate(cluster, trace, config, options);
  EXPECT_NE(other.fill.pods_placed, given.fill.pods_placed);
}

// The experiment the policy exists for, on the whole Alibaba cluster: FGD leaves fewer GPUs
// unallocated than best fit, at the first GPU pod that fails and at 100 % arrived workload.
TEST(Fill, FgdLeavesFewerGpusUnallocatedThanBestFitOnAlibabaPods) {
  const std::string dir = std::string(GPUFLEET_TRACES_DIR) + "/alibaba-gpu-v2023";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  const Cluster cluster = ReadAlibabaNodes(dir + "/openb_node_list_gpu_node.csv", 16, 8);
  Trace trace =
      ReadTrace(dir + "/openb_pod_list_gpushare40.csv", TraceFormat::kAlibabaPods, ReadOptions{});
  RemoveInfeasibleJobs(cluster, trace, true);
  for (double arrived : {0.0, 1.0}) {
    for (sched::WorkloadWeight weight :
         {sched::WorkloadWeight::kTasks, sched::WorkloadWeight::kGpus}) {
      SimOptions options = Options();
      options.mode = SimMode::kFill;
      options.fill_arrived = arrived;
      options.fgd_weight = weight;
      sched::SchedulerConfig config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
      const SimResult best_fit = Simulate(cluster, trace, config, options);
      config.placement = sched::PlacementPolicy::kFgd;
      const SimResult fgd = Simulate(cluster, trace, config, options);
      EXPECT_GT(fgd.fill.allocated_gpu_milli, best_fit.fill.allocated_gpu_milli) << arrived;
      EXPECT_LT(fgd.fill.fragmented_gpu_milli, best_fit.fill.fragmented_gpu_milli) << arrived;
    }
  }
}

// The fast path (one allocator kept across pods) must place exactly as one Schedule call per pod
// does, on real pod lists: whole, shared and multi-GPU pods, CPU and memory limits, both
// placements. A slice of the Alibaba cluster keeps the O(pods^2) reference quick.
TEST(Fill, FastPathMatchesScheduleOnAlibabaPods) {
  const std::string dir = std::string(GPUFLEET_TRACES_DIR) + "/alibaba-gpu-v2023";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  Cluster cluster = ReadAlibabaNodes(dir + "/openb_node_list_gpu_node.csv", 16, 8);
  cluster.nodes.resize(80);  // several GPU models, 1-8 GPUs per node
  for (const char* list : {"gpushare40", "multigpu50", "default"}) {
    Trace trace = ReadTrace(dir + "/openb_pod_list_" + list + ".csv", TraceFormat::kAlibabaPods,
                            ReadOptions{});
    RemoveInfeasibleJobs(cluster, trace, true);
    for (sched::PlacementPolicy placement :
         {sched::PlacementPolicy::kBinPack, sched::PlacementPolicy::kSpread,
          sched::PlacementPolicy::kFgd}) {
      sched::SchedulerConfig config = Config(sched::QueueOrder::kFifo, sched::Backfill::kNone);
      config.placement = placement;
      SimOptions options = Options();
      options.mode = SimMode::kFill;
      options.fill_engine = FillEngine::kAllocator;
      const SimResult fast = Simulate(cluster, trace, config, options);
      options.fill_engine = FillEngine::kSchedule;
      const SimResult reference = Simulate(cluster, trace, config, options);
      const std::string what = std::string(list) + " " + sched::Name(placement);
      EXPECT_GT(fast.fill.gpu_pods_placed, 0) << what;
      EXPECT_EQ(fast.fill.pods_placed, reference.fill.pods_placed) << what;
      EXPECT_EQ(fast.fill.gpu_pods_placed, reference.fill.gpu_pods_placed) << what;
      EXPECT_EQ(fast.fill.cpu_only_pods_failed, reference.fill.cpu_only_pods_failed) << what;
      EXPECT_EQ(fast.fill.passes, reference.fill.passes) << what;
      EXPECT_EQ(fast.fill.allocated_gpu_milli, reference.fill.allocated_gpu_milli) << what;
      ASSERT_TRUE(fast.fill.stop && reference.fill.stop) << what;
      EXPECT_EQ(fast.fill.stop->line, reference.fill.stop->line) << what;
      EXPECT_EQ(fast.fill.stop->reason, reference.fill.stop->reason) << what;
    }
  }
}

// A real trace end to end: every job completes, never faster than its duration, and the
// cluster is never over-allocated, with every policy.
TEST(Replay, ItpClusterInvariantsUnderEveryPolicy) {
  const std::string path = std::string(GPUFLEET_TRACES_DIR) + "/itp/cluster10.csv";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  UniformClusterShape shape;
  shape.nodes = 32;  // 256 GPUs, the size the ElasticFlow study used for cluster 10
  const Cluster cluster = MakeUniformCluster(shape);
  Trace trace = ReadTrace(path, TraceFormat::kItp, {});
  RemoveInfeasibleJobs(cluster, trace, true);
  ASSERT_FALSE(trace.jobs.empty());
  for (const std::string& name : sched::QueueOrderNames()) {
    const sched::QueueOrder order = *sched::ParseQueueOrder(name);
    const SimResult result = Simulate(cluster, trace, Config(order, sched::DefaultBackfill(order)),
                                      Options(Estimates::kOracle));
    ASSERT_EQ(result.jobs.size(), trace.jobs.size()) << name;
    for (size_t i = 0; i < trace.jobs.size(); ++i) {
      const JobOutcome& job = result.jobs[i];
      ASSERT_GE(job.first_start, job.submit_time) << name << " job " << i;
      ASSERT_GE(job.finish - job.first_start, trace.jobs[i].duration) << name << " job " << i;
    }
    for (const TimeSeriesPoint& point : result.time_series)
      ASSERT_LE(point.allocated_gpus, static_cast<double>(cluster.UsableGpus()) + 1e-9);
    const SimReport report = MakeReport(result, {});
    EXPECT_EQ(report.jobs_completed, static_cast<int64_t>(trace.jobs.size())) << name;
    EXPECT_GT(report.mean_gpu_allocation, 0) << name;
    EXPECT_LE(report.mean_gpu_allocation, 1) << name;
  }
}

Cluster EightNodes() {
  UniformClusterShape shape;
  shape.nodes = 8;
  return MakeUniformCluster(shape);
}

// Philly's first 800 jobs, those that fit `cluster`: a long queue on a small cluster.
Trace PhillyHead(const std::string& path, const Cluster& cluster) {
  ReadOptions read;
  read.limit = 800;
  Trace trace = ReadTrace(path, TraceFormat::kPhilly, read);
  RemoveInfeasibleJobs(cluster, trace, true);
  return trace;
}

// The simulator keeps its queue in the scheduler's order and lets cycles stop early; the
// scheduler then trusts that order. Any slip (a preempted job re-queued at the wrong place, a
// wrong CPU-only count) would change decisions, so both ways must give identical runs. Philly's
// first jobs on a small cluster keep a long queue, with preemptions under LAS and --preempt.
TEST(Replay, CycleHintsChangeNothing) {
  const std::string path = std::string(GPUFLEET_TRACES_DIR) + "/philly/philly.csv";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  const Cluster cluster = EightNodes();
  Trace trace = PhillyHead(path, cluster);
  // Priorities make FIFO preemption possible.
  for (size_t i = 0; i < trace.jobs.size(); i += 7)
    trace.jobs[i].spec.priority = 1;
  struct Variant {
    sched::QueueOrder order;
    sched::Backfill backfill;
    bool preempt;
    double starvation;
    sched::PlacementPolicy placement;
  };
  constexpr auto kBinPack = sched::PlacementPolicy::kBinPack;
  for (const Variant& v :
       {Variant{sched::QueueOrder::kFifo, sched::Backfill::kNone, false, 0, kBinPack},
        Variant{sched::QueueOrder::kFifo, sched::Backfill::kEasy, true, 0, kBinPack},
        Variant{sched::QueueOrder::kSjf, sched::Backfill::kFirstFit, false, 0, kBinPack},
        Variant{sched::QueueOrder::kSjf, sched::Backfill::kEasy, true, 0, kBinPack},
        Variant{sched::QueueOrder::kLas, sched::Backfill::kFirstFit, false, 0, kBinPack},
        Variant{sched::QueueOrder::kLas, sched::Backfill::kFirstFit, false, 2, kBinPack},
        Variant{sched::QueueOrder::kFairShare, sched::Backfill::kEasy, false, 0, kBinPack},
        Variant{sched::QueueOrder::kFairShare, sched::Backfill::kFirstFit, true, 0, kBinPack},
        // FGD's caches live in the simulator's allocator across cycles and preemptions.
        Variant{sched::QueueOrder::kLas, sched::Backfill::kFirstFit, false, 0,
                sched::PlacementPolicy::kFgd}}) {
    sched::SchedulerConfig config = Config(v.order, v.backfill);
    config.placement = v.placement;
    // A short half-life reorders the trace's virtual clusters often: the kept queue is re-sorted
    // each time, and must give what a full sort on every cycle gives.
    config.fair_share_half_life_s = 3600;
    config.preempt = v.preempt;
    config.las_starvation_factor = v.starvation;
    SimOptions options = Options(Estimates::kOracle);
    const SimResult hinted = Simulate(cluster, trace, config, options);
    options.cycle_hints = false;
    const SimResult plain = Simulate(cluster, trace, config, options);
    const std::string what =
        fmt::format("{} {} preempt={} starvation={} {}", sched::Name(v.order),
                    sched::Name(v.backfill), v.preempt, v.starvation, sched::Name(v.placement));
    ASSERT_EQ(hinted.jobs.size(), plain.jobs.size()) << what;
    for (size_t i = 0; i < plain.jobs.size(); ++i) {
      ASSERT_EQ(hinted.jobs[i].first_start, plain.jobs[i].first_start) << what << " job " << i;
      ASSERT_EQ(hinted.jobs[i].finish, plain.jobs[i].finish) << what << " job " << i;
      ASSERT_EQ(hinted.jobs[i].preemptions, plain.jobs[i].preemptions) << what << " job " << i;
    }
    // Cycles where every GPU is taken and nobody may be preempted are skipped (SJF here fills
    // the cluster often; strict FIFO mostly waits with GPUs free behind a blocked head).
    EXPECT_LE(hinted.scheduling_cycles, plain.scheduling_cycles) << what;
    if (v.order == sched::QueueOrder::kSjf && !v.preempt) {
      EXPECT_LT(hinted.scheduling_cycles, plain.scheduling_cycles) << what;
    }
    EXPECT_EQ(hinted.preemptions, plain.preemptions) << what;
    if (v.order == sched::QueueOrder::kLas || v.preempt) {
      EXPECT_GT(plain.preemptions, 0) << what;
    }
  }
}

// Queue a floods the cluster first; b's jobs arrive later. FIFO serves a's backlog first; fair
// share lets b, which used nothing, go ahead of a's waiting jobs.
TEST(FairShare, QueueThatUsedLessGoesFirst) {
  std::vector<TraceJob> jobs;
  for (JobId id = 0; id < 10; ++id) {
    jobs.push_back(Job(id, static_cast<double>(id), 100, 4));
    jobs.back().spec.queue = "a";
  }
  for (JobId id = 10; id < 13; ++id) {
    jobs.push_back(Job(id, 50, 100, 4));
    jobs.back().spec.queue = "b";
  }
  const Trace trace = MakeTrace(jobs);
  const SimResult fifo = Simulate(
      OneNode(4), trace, Config(sched::QueueOrder::kFifo, sched::Backfill::kNone), Options());
  const SimResult fair = Simulate(
      OneNode(4), trace, Config(sched::QueueOrder::kFairShare, sched::Backfill::kEasy), Options());
  // FIFO: b's first job starts after all ten of a's.
  EXPECT_EQ(fifo.jobs[10].first_start, 1000 * kSec);
  // Fair share: once a's first job ends, b (no usage) goes ahead of a's backlog, and a gets its
  // turn back as b's usage grows past a's decayed share.
  EXPECT_EQ(fair.jobs[10].first_start, 100 * kSec);
  EXPECT_LT(fair.jobs[12].first_start, fifo.jobs[12].first_start);
  // The queues are those the jobs name (none configured), reported with their GPU time...
  ASSERT_EQ(fair.queue_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(fair.queue_gpu_milli_ms[1], 3 * 4 * 100.0 * kSec * kMilliPerGpu);
  // ...and over time, in buckets that add up to the same totals.
  ASSERT_FALSE(fair.queue_bucket_gpu_milli_ms.empty());
  for (size_t q = 0; q < 2; ++q) {
    double sum = 0;
    for (const std::vector<double>& bucket : fair.queue_bucket_gpu_milli_ms)
      sum += bucket[q];
    EXPECT_DOUBLE_EQ(sum, fair.queue_gpu_milli_ms[q]) << q;
  }
  EXPECT_TRUE(fifo.queue_names.empty());
}

// Buckets start at an hour and double, merging neighbours, so a long run keeps at most
// kMaxQueueBuckets of them and loses no GPU time.
// A preempted run counts for its queue as a finished one does, and only until it stops. On 4 GPUs:
// a1 (team a) runs 100 s until b1, of higher priority, preempts it and runs 50 s. At 150 s a1, a2
// and b2 wait: a used 400 GPU-s and b 200, so b2 goes first and a1 (4 GPUs) waits behind it while
// a2 fits beside it. Were a1's preempted run lost, a would have used nothing and a1 would take
// every GPU at 150 s.
TEST(FairShare, PreemptedRunsCountForTheirQueue) {
  std::vector<TraceJob> jobs = {Job(0, 0, 1000, 4), Job(1, 100, 50, 4, 1), Job(2, 150, 10, 2),
                                Job(3, 150, 10, 2)};
  for (const size_t i : {0, 2})
    jobs[i].spec.queue = "a";
  for (const size_t i : {1, 3})
    jobs[i].spec.queue = "b";
  sched::SchedulerConfig config = Config(sched::QueueOrder::kFairShare, sched::Backfill::kFirstFit);
  config.preempt = true;
  for (const bool hints : {true, false}) {
    SimOptions options = Options();
    options.cycle_hints = hints;
    const SimResult result = Simulate(OneNode(4), MakeTrace(jobs), config, options);
    EXPECT_EQ(result.jobs[0].preemptions, 1);
    EXPECT_EQ(result.jobs[3].first_start, 150 * kSec) << "hints " << hints;
    EXPECT_EQ(result.jobs[2].first_start, 150 * kSec) << "hints " << hints;
    EXPECT_EQ(result.jobs[0].finish, (160 + 900 + 30) * kSec) << "hints " << hints;
  }
  // And a preempted run stops counting: b1 now runs 500 s (2,000 GPU-s against a's 400), so at
  // 600 s a goes first and a1 takes every GPU. Were a1 still counted as running, a would have
  // used 2,400 and b2 and a2 would start instead.
  jobs[1].duration = 500 * kSec;
  for (const size_t i : {2, 3})
    jobs[i].spec.submit_time = 600 * kSec;
  for (const bool hints : {true, false}) {
    SimOptions options = Options();
    options.cycle_hints = hints;
    const SimResult result = Simulate(OneNode(4), MakeTrace(jobs), config, options);
    EXPECT_EQ(result.jobs[0].finish, (600 + 900 + 30) * kSec) << "hints " << hints;
    EXPECT_EQ(result.jobs[3].first_start, (600 + 900 + 30) * kSec) << "hints " << hints;
  }
}

TEST(FairShare, QueueBucketsDoubleOnLongRuns) {
  std::vector<TraceJob> jobs;
  for (JobId id = 0; id < 200; ++id) {
    jobs.push_back(Job(id, static_cast<double>(id) * 3600, 1800, 1));
    jobs.back().spec.queue = id % 3 == 0 ? "x" : "y";
  }
  const SimResult result =
      Simulate(OneNode(4), MakeTrace(jobs),
               Config(sched::QueueOrder::kFairShare, sched::Backfill::kEasy), Options());
  EXPECT_LE(result.queue_bucket_gpu_milli_ms.size(), SimResult::kMaxQueueBuckets);
  EXPECT_GT(result.queue_bucket_gpu_milli_ms.size(), SimResult::kMaxQueueBuckets / 2);
  EXPECT_EQ(result.queue_bucket_ms, 4 * 3600 * kSec);  // 200 hours: 1 h doubled twice
  double sum = 0;
  for (const std::vector<double>& bucket : result.queue_bucket_gpu_milli_ms)
    sum += bucket[0] + bucket[1];
  EXPECT_DOUBLE_EQ(sum, 200 * 1800.0 * kSec * kMilliPerGpu);

  EXPECT_DOUBLE_EQ(result.queue_bucket_gpu_milli_ms[1][0] + result.queue_bucket_gpu_milli_ms[1][1],
                   4 * 1800.0 * kSec * kMilliPerGpu);
}

// The same with team queues: the quota cycle passes jobs over and stops early by its own bounds
// (reclaim room, victims per queue and class, blocked queues), which must change no decision.
TEST(Replay, CycleHintsChangeNothingWithQueues) {
  const std::string path = std::string(GPUFLEET_TRACES_DIR) + "/philly/philly.csv";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  const Cluster cluster = EightNodes();
  Trace trace = PhillyHead(path, cluster);
  const std::vector<std::string> names = {"a", "b", "c"};
  // Some jobs of higher priority rank ahead of their queue's blocked head when they arrive.
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    trace.jobs[i].spec.queue = names[i % 5 == 0 ? 2 : i % 2];
    if (i % 7 == 3) trace.jobs[i].spec.priority = 1;
  }
  std::vector<sched::QueueConfig> queues(3);
  for (size_t q = 0; q < 3; ++q) {
    queues[q].name = names[q];
    queues[q].cohort = "all";
  }
  queues[0].guaranteed_milli = 32 * kMilliPerGpu;
  queues[1].guaranteed_milli = 16 * kMilliPerGpu;
  queues[1].borrowing_limit_milli = 8 * kMilliPerGpu;
  queues[2].guaranteed_milli = 16 * kMilliPerGpu;
  queues[0].weight = 3;  // for fair share
  struct Variant {
    sched::QueueOrder order;
    sched::Backfill backfill;
  };
  for (const auto [order, backfill] :
       {Variant{sched::QueueOrder::kFifo, sched::Backfill::kNone},
        Variant{sched::QueueOrder::kSjf, sched::DefaultBackfill(sched::QueueOrder::kSjf)},
        Variant{sched::QueueOrder::kLas, sched::DefaultBackfill(sched::QueueOrder::kLas)},
        Variant{sched::QueueOrder::kFairShare, sched::Backfill::kEasy},
        // Strict orders skip cycles after one that decided nothing (see Replay::Settle).
        Variant{sched::QueueOrder::kSjf, sched::Backfill::kNone},
        Variant{sched::QueueOrder::kFairShare, sched::Backfill::kNone}}) {
    sched::SchedulerConfig config = Config(order, backfill);
    config.queues = queues;
    config.fair_share_half_life_s = 3600;
    SimOptions options = Options(Estimates::kOracle);
    const SimResult hinted = Simulate(cluster, trace, config, options);
    options.cycle_hints = false;
    const SimResult plain = Simulate(cluster, trace, config, options);
    ASSERT_EQ(hinted.jobs.size(), plain.jobs.size()) << sched::Name(order);
    for (size_t i = 0; i < plain.jobs.size(); ++i) {
      ASSERT_EQ(hinted.jobs[i].first_start, plain.jobs[i].first_start) << sched::Name(order) << i;
      ASSERT_EQ(hinted.jobs[i].finish, plain.jobs[i].finish) << sched::Name(order) << i;
      ASSERT_EQ(hinted.jobs[i].preemptions, plain.jobs[i].preemptions) << sched::Name(order) << i;
    }
    EXPECT_EQ(hinted.preemptions, plain.preemptions) << sched::Name(order);
    if (order == sched::QueueOrder::kLas) {
      EXPECT_GT(plain.preemptions, 0);
    }
    EXPECT_LE(hinted.scheduling_cycles, plain.scheduling_cycles) << sched::Name(order);
    if (backfill == sched::Backfill::kNone) {
      EXPECT_LT(hinted.scheduling_cycles, plain.scheduling_cycles) << sched::Name(order);
    }
  }
}

TEST(Names, ParseAndName) {
  EXPECT_EQ(ParseEstimates("oracle"), Estimates::kOracle);
  EXPECT_EQ(ParseEstimates("none"), Estimates::kNone);
  EXPECT_FALSE(ParseEstimates("magic"));
  EXPECT_EQ(ParseSimMode("fill"), SimMode::kFill);
  EXPECT_EQ(ParseSimMode("replay"), SimMode::kReplay);
  EXPECT_FALSE(ParseSimMode("rewind"));
  for (const std::string& name : EstimatesNames())
    EXPECT_EQ(Name(*ParseEstimates(name)), name);
  for (const std::string& name : SimModeNames())
    EXPECT_EQ(Name(*ParseSimMode(name)), name);
}

}  // namespace
}  // namespace gpufleet::sim
