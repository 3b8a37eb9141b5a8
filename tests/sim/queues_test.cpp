// Team queues in the simulator: the queues file, the mapping of trace jobs to queues, reclaim in
// a replay, and the per-queue report with Jain's fairness index.
#include "sim/queues.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "sim/report.h"
#include "sim/simulator.h"

namespace gpufleet::sim {
namespace {

constexpr TimeMs kSec = kMsPerSecond;

TraceJob Job(JobId id, double submit_s, double duration_s, int32_t gpus, std::string vc) {
  TraceJob job;
  job.spec.id = id;
  job.spec.gpu_milli_per_task = gpus * kMilliPerGpu;
  job.spec.submit_time = static_cast<TimeMs>(submit_s * kSec);
  job.spec.queue = std::move(vc);
  job.duration = static_cast<TimeMs>(duration_s * kSec);
  job.line = static_cast<int64_t>(id) + 2;
  return job;
}

Cluster OneNode(int32_t gpus) {
  UniformClusterShape shape;
  shape.nodes = 1;
  shape.gpus_per_node = gpus;
  shape.gpus_per_nvlink_island = gpus;
  return MakeUniformCluster(shape);
}

TEST(QueuesFile, ParsesEveryKey) {
  const auto queues = ParseQueues(YAML::Load(R"(
- name: a
  cohort: c
  guaranteed_gpus: 2.5
  borrowing_limit_gpus: 4
  weight: 2
  members: [vc1, vc2]
  teams: [speech, vision]
- name: b
  guaranteed_gpus: {A100-40GB: 8, H100-80GB: 4}
)"),
                                  true);
  ASSERT_EQ(queues.size(), 2u);
  EXPECT_EQ(queues[0].config.name, "a");
  EXPECT_EQ(queues[0].config.cohort, "c");
  EXPECT_EQ(queues[0].config.guaranteed_milli, 2500);
  EXPECT_EQ(queues[0].config.borrowing_limit_milli, 4000);
  EXPECT_EQ(queues[0].config.weight, 2.0);
  EXPECT_EQ(queues[0].members, (std::vector<std::string>{"vc1", "vc2"}));
  EXPECT_EQ(queues[0].config.teams, (std::vector<std::string>{"speech", "vision"}));
  EXPECT_TRUE(queues[1].config.teams.empty());
  EXPECT_EQ(queues[1].config.guaranteed_milli_by_model.at("A100-40GB"), 8000);
  EXPECT_EQ(queues[1].config.guaranteed_milli_by_model.at("H100-80GB"), 4000);
  EXPECT_FALSE(queues[1].config.borrowing_limit_milli.has_value());
}

TEST(QueuesFile, RejectsMistakes) {
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, guaranted_gpus: 1}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a}\n- {name: a}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, guaranteed_gpus: -1}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, weight: 0}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, members: [x]}"), false), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("{name: a}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, teams: speech}"), true), QueuesError);
  EXPECT_THROW(ParseQueues(YAML::Load("- {name: a, teams: ['']}"), true), QueuesError);
}

TEST(QueuesFile, AssignsByVirtualClusterOrRoundRobin) {
  const auto queues = ParseQueues(
      YAML::Load("- {name: a, members: [vc1]}\n- {name: vc2}\n- {name: rest, members: ['*']}"),
      true);
  Trace trace;
  trace.jobs = {Job(0, 0, 1, 1, "vc1"), Job(1, 0, 1, 1, "vc2"), Job(2, 0, 1, 1, "vc9")};
  Trace by_vc = trace;
  AssignQueues(by_vc, queues, QueueBy::kVc);
  EXPECT_EQ(by_vc.jobs[0].spec.queue, "a");
  EXPECT_EQ(by_vc.jobs[1].spec.queue, "vc2");
  EXPECT_EQ(by_vc.jobs[2].spec.queue, "rest");
  Trace round_robin = trace;
  AssignQueues(round_robin, queues, QueueBy::kRoundRobin);
  EXPECT_EQ(round_robin.jobs[0].spec.queue, "a");
  EXPECT_EQ(round_robin.jobs[1].spec.queue, "vc2");
  EXPECT_EQ(round_robin.jobs[2].spec.queue, "rest");
  // Without a catch-all, an unlisted virtual cluster is an error naming the line.
  const auto strict = ParseQueues(YAML::Load("- {name: a, members: [vc1]}"), true);
  Trace unlisted = trace;
  unlisted.source = "t.csv";
  EXPECT_THROW(AssignQueues(unlisted, strict, QueueBy::kVc), QueuesError);
}

// 4 GPUs; queues a and b guarantee 2 each in one cohort. b's two 1-GPU jobs and its 2-GPU job
// fill the node at 0 (b borrows 2 of a's). a's job at 10 s is within a's guarantee and reclaims
// 2 GPUs from b; it finishes at 110 s, and b's preempted work resumes.
TEST(QueueReplay, ReclaimsBorrowedGpusAndReportsPerQueue) {
  sched::SchedulerConfig config;
  config.backfill = sched::Backfill::kFirstFit;
  for (const auto& entry : ParseQueues(YAML::Load("- {name: a, cohort: c, guaranteed_gpus: 2}\n"
                                                  "- {name: b, cohort: c, guaranteed_gpus: 2}"),
                                       false))
    config.queues.push_back(entry.config);
  Trace trace;
  trace.source = "test.csv";
  trace.jobs = {Job(0, 0, 1000, 1, "b"), Job(1, 0, 1000, 1, "b"), Job(2, 0, 1000, 2, "b"),
                Job(3, 10, 100, 2, "a")};
  SimOptions options;
  options.restart_cost_ms = 0;
  const SimResult result = Simulate(OneNode(4), trace, config, options);
  EXPECT_EQ(result.jobs[3].first_start, 10 * kSec) << "a's job waited instead of reclaiming";
  EXPECT_EQ(result.jobs[3].finish, 110 * kSec);
  EXPECT_EQ(result.preemptions, 1) << "one 2-GPU victim suffices";
  EXPECT_EQ(result.jobs[2].preemptions, 1);
  ASSERT_EQ(result.queue_names, (std::vector<std::string>{"a", "b"}));

  const SimReport report = MakeReport(result, RunDescription{});
  ASSERT_EQ(report.queues.size(), 2u);
  EXPECT_EQ(report.queues[0].jobs, 1);
  EXPECT_EQ(report.queues[0].preemptions, 0);
  EXPECT_DOUBLE_EQ(report.queues[0].jct_mean_s, 100);
  EXPECT_EQ(report.queues[1].jobs, 3);
  EXPECT_EQ(report.queues[1].preemptions, 1);
  // a held 2 GPUs for 100 s; b 4000 GPU-s of work.
  EXPECT_NEAR(report.queues[0].gpu_share, 200.0 / 4200.0, 1e-9);
  EXPECT_NEAR(report.queue_fairness, JainIndex(std::vector<double>{200.0 / 4200, 4000.0 / 4200}),
              1e-12);
  const auto json = ToJson(report);
  EXPECT_EQ(json["queues"]["per_queue"][1]["name"], "b");
  EXPECT_EQ(json["queues"]["per_queue"][1]["preemptions"], 1);
  EXPECT_NE(FormatReport(report).find("queue fairness (Jain)"), std::string::npos);

  // Without queues the report has no queue section at all.
  config.queues.clear();
  const SimReport plain = MakeReport(Simulate(OneNode(4), trace, config, options), {});
  EXPECT_TRUE(plain.queues.empty());
  EXPECT_FALSE(ToJson(plain).contains("queues"));
}

TEST(QueueReplay, JobOfAnUnconfiguredQueueIsAnError) {
  sched::SchedulerConfig config;
  sched::QueueConfig queue;
  queue.name = "a";
  queue.guaranteed_milli = 1000;
  config.queues = {queue};
  Trace trace;
  trace.source = "test.csv";
  trace.jobs = {Job(0, 0, 10, 1, "zzz")};
  EXPECT_THROW(Simulate(OneNode(1), trace, config, SimOptions{}), SimError);
}

TEST(JainIndex, EqualSharesAreFairOneHolderIsNot) {
  EXPECT_DOUBLE_EQ(JainIndex(std::vector<double>{0.25, 0.25, 0.25, 0.25}), 1.0);
  EXPECT_DOUBLE_EQ(JainIndex(std::vector<double>{1, 0, 0, 0}), 0.25);
  EXPECT_DOUBLE_EQ(JainIndex(std::vector<double>{}), 0.0);
}

}  // namespace
}  // namespace gpufleet::sim
