// The job lifecycle without HTTP: placement, agents' reports, gang failure, cancel, requeue, the
// service LAS reads from the events, and the environment each task gets.

#include "server/lifecycle.h"

#include <gtest/gtest.h>

namespace gpufleet::server {
namespace {

using api::JobRecord;
using api::JobState;
using api::TaskStatus;
using api::WorkloadReport;

JobRecord PendingJob(int32_t tasks, MilliGpu gpus_per_task = 4000) {
  JobRecord job;
  job.id = 7;
  job.user = "alice";
  job.team = "vision";
  job.spec.tasks = tasks;
  job.spec.gpu_milli_per_task = gpus_per_task;
  job.spec.command = {"python3", "train.py"};
  job.created_ms = 1000;
  SetState(job, JobState::kPending, "submitted by alice", 1000);
  return job;
}

std::vector<TaskStatus> Tasks(const JobRecord& job, std::vector<std::string> nodes) {
  std::vector<TaskStatus> tasks;
  for (size_t rank = 0; rank < nodes.size(); ++rank) {
    TaskStatus task;
    task.rank = static_cast<int32_t>(rank);
    task.node = nodes[rank];
    task.gpu_indices = {0, 1, 2, 3};
    task.gpu_milli = 1000;
    task.workload_id = WorkloadId(job.id, task.rank, job.attempt);
    tasks.push_back(task);
  }
  return tasks;
}

WorkloadReport Report(const JobRecord& job, int32_t rank, std::string state,
                      std::optional<int32_t> exit_code = std::nullopt) {
  WorkloadReport report;
  report.job_id = job.id;
  report.rank = rank;
  report.attempt = job.attempt;
  report.workload_id = WorkloadId(job.id, rank, job.attempt);
  report.state = std::move(state);
  report.exit_code = exit_code;
  return report;
}

std::vector<std::string> Path(const JobRecord& job) {
  std::vector<std::string> path;
  for (const api::JobEvent& event : job.events)
    path.push_back(event.from + ">" + event.to);
  return path;
}

TEST(Lifecycle, WorkloadIdNamesJobRankAndAttempt) {
  EXPECT_EQ(WorkloadId(42, 0, 1), "j42-r0-a1");
  EXPECT_EQ(MasterPort(42), 20042);
  EXPECT_EQ(MasterPort(123456), 23456);
}

TEST(Lifecycle, GangRunsThroughEveryStateToSuccess) {
  JobRecord job = PendingJob(2);
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed on n1, n2", 2000);
  EXPECT_EQ(job.state, JobState::kScheduled);

  ReportEffect effect = ApplyWorkloadReport(job, Report(job, 0, "running"), "n1", 3000);
  EXPECT_TRUE(effect.changed);
  EXPECT_FALSE(effect.ended);
  EXPECT_EQ(job.state, JobState::kStarting);
  EXPECT_EQ(job.events.back().reason, "task 0 started on node n1");

  // The same report again changes nothing.
  EXPECT_FALSE(ApplyWorkloadReport(job, Report(job, 0, "running"), "n1", 3100).changed);

  ApplyWorkloadReport(job, Report(job, 1, "running"), "n2", 4000);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.started_ms, 4000);

  ApplyWorkloadReport(job, Report(job, 0, "exited", 0), "n1", 5000);
  EXPECT_EQ(job.state, JobState::kRunning);  // rank 1 still runs
  effect = ApplyWorkloadReport(job, Report(job, 1, "exited", 0), "n2", 6000);
  EXPECT_TRUE(effect.ended);
  EXPECT_EQ(job.state, JobState::kSucceeded);
  EXPECT_EQ(job.exit_code, 0);
  EXPECT_EQ(job.finished_ms, 6000);
  EXPECT_EQ(Path(job),
            (std::vector<std::string>{">pending", "pending>scheduled", "scheduled>starting",
                                      "starting>running", "running>succeeded"}));
}

TEST(Lifecycle, OneTaskExitingNonZeroFailsTheGang) {
  JobRecord job = PendingJob(2);
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  ApplyWorkloadReport(job, Report(job, 0, "running"), "n1", 3000);
  ApplyWorkloadReport(job, Report(job, 1, "running"), "n2", 3000);
  const ReportEffect effect = ApplyWorkloadReport(job, Report(job, 1, "exited", 3), "n2", 4000);
  EXPECT_TRUE(effect.ended);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason, "task 1 on node n2 exited with code 3");
  EXPECT_EQ(job.exit_code, 3);
  EXPECT_EQ(job.finished_ms, 4000);
  // Later reports of the gang's other task change nothing: the job has ended.
  EXPECT_FALSE(ApplyWorkloadReport(job, Report(job, 0, "exited", 143), "n1", 5000).changed);
}

TEST(Lifecycle, SignalsAndStartFailuresSayWhatHappened) {
  JobRecord killed = PendingJob(1);
  PlaceJob(killed, Tasks(killed, {"n1"}), "placed", 2000);
  WorkloadReport report = Report(killed, 0, "exited");
  report.signal = 9;
  ApplyWorkloadReport(killed, report, "n1", 3000);
  EXPECT_EQ(killed.state, JobState::kFailed);
  EXPECT_EQ(killed.reason, "task 0 on node n1 was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(killed.exit_code, 128 + 9);

  JobRecord broken = PendingJob(1);
  PlaceJob(broken, Tasks(broken, {"n1"}), "placed", 2000);
  report = Report(broken, 0, "failed_to_start");
  report.error = "no such file: train.py";
  ApplyWorkloadReport(broken, report, "n1", 3000);
  EXPECT_EQ(broken.state, JobState::kFailed);
  EXPECT_EQ(broken.reason, "task 0 on node n1 failed to start: no such file: train.py");
  EXPECT_EQ(Path(broken),
            (std::vector<std::string>{">pending", "pending>scheduled", "scheduled>failed"}));
}

TEST(Lifecycle, ShortTaskSeenOnlyAfterItExitedStillPassesThroughRunning) {
  JobRecord job = PendingJob(1);
  PlaceJob(job, Tasks(job, {"n1"}), "placed", 2000);
  ApplyWorkloadReport(job, Report(job, 0, "exited", 0), "n1", 3000);
  EXPECT_EQ(job.state, JobState::kSucceeded);
  EXPECT_EQ(Path(job),
            (std::vector<std::string>{">pending", "pending>scheduled", "scheduled>starting",
                                      "starting>running", "running>succeeded"}));
}

TEST(Lifecycle, StaleAndMisdirectedReportsAreIgnored) {
  JobRecord job = PendingJob(2);
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  WorkloadReport old_attempt = Report(job, 0, "exited", 1);
  old_attempt.attempt = job.attempt + 1;
  EXPECT_FALSE(ApplyWorkloadReport(job, old_attempt, "n1", 3000).changed);
  EXPECT_FALSE(ApplyWorkloadReport(job, Report(job, 0, "exited", 1), "n2", 3000).changed);
  EXPECT_FALSE(ApplyWorkloadReport(job, Report(job, 5, "exited", 1), "n1", 3000).changed);
  WorkloadReport other_id = Report(job, 0, "exited", 1);
  other_id.workload_id = "j7-r0-a9";
  EXPECT_FALSE(ApplyWorkloadReport(job, other_id, "n1", 3000).changed);
  WorkloadReport other_job = Report(job, 0, "exited", 1);
  other_job.job_id = 8;
  EXPECT_FALSE(ApplyWorkloadReport(job, other_job, "n1", 3000).changed);
  EXPECT_EQ(job.state, JobState::kScheduled);

  JobRecord pending = PendingJob(1);
  EXPECT_FALSE(ApplyWorkloadReport(pending, Report(pending, 0, "running"), "n1", 3000).changed);
}

TEST(Lifecycle, CancelEndsAnyJobThatHasNotEnded) {
  JobRecord job = PendingJob(1);
  PlaceJob(job, Tasks(job, {"n1"}), "placed", 2000);
  ApplyWorkloadReport(job, Report(job, 0, "running"), "n1", 3000);
  EXPECT_TRUE(CancelJob(job, "cancelled by alice", 4000));
  EXPECT_EQ(job.state, JobState::kCancelled);
  EXPECT_EQ(job.reason, "cancelled by alice");
  EXPECT_EQ(job.finished_ms, 4000);
  EXPECT_FALSE(CancelJob(job, "again", 5000));
  EXPECT_EQ(job.events.back().to, "cancelled");
  EXPECT_EQ(job.events.size(), 5u);  // pending, scheduled, starting, running, cancelled

  JobRecord pending = PendingJob(1);
  EXPECT_TRUE(CancelJob(pending, "cancelled by bob", 1500));
  EXPECT_EQ(Path(pending), (std::vector<std::string>{">pending", "pending>cancelled"}));
}

TEST(Lifecycle, RequeueStartsANewAttemptWithoutTasks) {
  JobRecord job = PendingJob(2);
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  ApplyWorkloadReport(job, Report(job, 0, "running"), "n1", 3000);
  ApplyWorkloadReport(job, Report(job, 1, "running"), "n2", 3000);
  RequeueJob(job, "node n2 lost: no sync for 30s", 10000);
  EXPECT_EQ(job.state, JobState::kPending);
  EXPECT_EQ(job.attempt, 1);
  EXPECT_TRUE(job.tasks.empty());
  EXPECT_EQ(job.started_ms, 0);
  EXPECT_EQ(job.events.back().reason, "node n2 lost: no sync for 30s");
  // A report of the old attempt cannot touch the new one.
  PlaceJob(job, Tasks(job, {"n1", "n3"}), "placed again", 11000);
  EXPECT_EQ(job.tasks[1].workload_id, "j7-r1-a1");
  WorkloadReport stale;
  stale.job_id = job.id;
  stale.rank = 0;
  stale.attempt = 0;
  stale.workload_id = "j7-r0-a0";
  stale.state = "exited";
  stale.exit_code = 137;
  EXPECT_FALSE(ApplyWorkloadReport(job, stale, "n1", 12000).changed);
  EXPECT_EQ(job.state, JobState::kScheduled);
}

TEST(Lifecycle, ServiceAddsUpTheTimeGpusWereHeld) {
  JobRecord job = PendingJob(2, 2000);  // 4 GPUs in all
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  RequeueJob(job, "preempted", 5000);  // held 3 s
  Service service = ServiceOf(job, 6000);
  EXPECT_EQ(service.attained_gpu_ms, 4 * 3000);
  EXPECT_EQ(service.last_run_end, 5000);
  EXPECT_EQ(service.preemptions, 1);
  EXPECT_EQ(service.run_start, 0);

  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 7000);
  service = ServiceOf(job, 9000);  // and 2 s of the current run
  EXPECT_EQ(service.attained_gpu_ms, 4 * 5000);
  EXPECT_EQ(service.run_start, 7000);
}

TEST(Lifecycle, UsageCountsHeldGpuTimeWithinThePeriod) {
  JobRecord job = PendingJob(2, 2000);  // 4 GPUs in all
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  RequeueJob(job, "preempted", 5000);                       // held [2 s, 5 s)
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 7000);  // held from 7 s, still at 9 s
  EXPECT_EQ(GpuMsBetween(job, 0, 100000, 9000), 4 * (3000 + 2000));
  EXPECT_EQ(GpuMsBetween(job, 4000, 8000, 9000), 4 * (1000 + 1000));
  EXPECT_EQ(GpuMsBetween(job, 5000, 7000, 9000), 0);  // pending between the attempts
  EXPECT_EQ(GpuMsBetween(job, 0, 100000, 9000), ServiceOf(job, 9000).attained_gpu_ms);
  EXPECT_EQ(GpuMsBetween(PendingJob(1), 0, 100000, 9000), 0);
}

TEST(Lifecycle, ToJobSpecCarriesTheRequest) {
  JobRecord job = PendingJob(3, 500);
  job.spec.priority = 5;
  job.spec.gpu_models = {"H100-80GB"};
  job.spec.runtime_estimate_ms = 60000;
  const JobSpec spec = ToJobSpec(job);
  EXPECT_EQ(spec.id, 7u);
  EXPECT_EQ(spec.tasks, 3);
  EXPECT_EQ(spec.gpu_milli_per_task, 500);
  EXPECT_EQ(spec.priority, 5);
  EXPECT_EQ(spec.submit_time, 1000);
  EXPECT_EQ(spec.gpu_models, std::vector<std::string>{"H100-80GB"});
  EXPECT_EQ(spec.runtime_estimate, 60000);
}

TEST(Lifecycle, TaskLaunchHasTheGangEnvironmentWhichTheJobCannotOverride) {
  JobRecord job = PendingJob(2);
  job.spec.env = {{"SEED", "1"}, {"RANK", "99"}, {"MASTER_ADDR", "evil"}};
  job.spec.workdir = "/data/run";
  job.spec.cpu_milli_per_task = 4000;
  job.spec.max_runtime_ms = 3600000;
  job.attempt = 2;
  PlaceJob(job, Tasks(job, {"n1", "n2"}), "placed", 2000);
  const api::TaskLaunch launch = MakeTaskLaunch(job, 1, "10.0.0.1");
  EXPECT_EQ(launch.workload_id, "j7-r1-a2");
  EXPECT_EQ(launch.argv, job.spec.command);
  EXPECT_EQ(launch.workdir, "/data/run");
  EXPECT_EQ(launch.gpu_indices, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(launch.cpu_milli, 4000);
  EXPECT_EQ(launch.max_runtime_ms, 3600000);
  const std::map<std::string, std::string> expected = {{"SEED", "1"},
                                                       {"MASTER_ADDR", "10.0.0.1"},
                                                       {"MASTER_PORT", "20007"},
                                                       {"WORLD_SIZE", "2"},
                                                       {"RANK", "1"},
                                                       {"NODE_RANK", "1"},
                                                       {"LOCAL_RANK", "0"},
                                                       {"LOCAL_WORLD_SIZE", "1"},
                                                       {"GPUFLEET_JOB_ID", "7"},
                                                       {"GPUFLEET_TASK_INDEX", "1"},
                                                       {"GPUFLEET_NNODES", "2"},
                                                       {"GPUFLEET_ATTEMPT", "2"},
                                                       {"GPUFLEET_RESTART_COUNT", "2"}};
  EXPECT_EQ(launch.env, expected);
  EXPECT_EQ(launch.grace_period_ms, 30000);
  EXPECT_EQ(launch.checkpoint_dir, "");  // the agent's own
  EXPECT_EQ(MakeTaskLaunch(job, 0, "10.0.0.1", "/shared/ckpt").checkpoint_dir,
            "/shared/ckpt/job-7");
}

// Several tasks on each node: a node's ranks are consecutive, LOCAL_RANK counts within it.
TEST(Lifecycle, TasksPerNodeSetsNodeAndLocalRanks) {
  JobRecord job = PendingJob(4, 1000);
  job.spec.tasks_per_node = 2;
  PlaceJob(job, Tasks(job, {"n1", "n1", "n2", "n2"}), "placed", 2000);
  const api::TaskLaunch launch = MakeTaskLaunch(job, 3, "10.0.0.1");
  EXPECT_EQ(launch.env.at("RANK"), "3");
  EXPECT_EQ(launch.env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(launch.env.at("NODE_RANK"), "1");
  EXPECT_EQ(launch.env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(launch.env.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(launch.env.at("GPUFLEET_NNODES"), "2");
  EXPECT_EQ(launch.user, "alice");
  EXPECT_EQ(ToJobSpec(job).tasks_per_node, 2);
}

}  // namespace
}  // namespace gpufleet::server
