// The API's JSON: a user's job is parsed strictly (each mistake named), every other type round
// trips unchanged.

#include "api/json.h"

#include <gtest/gtest.h>

namespace gpufleet::api {
namespace {

using nlohmann::json;

std::string ErrorOf(const std::string& text) {
  std::string error;
  EXPECT_FALSE(ParseJobSubmissionText(text, error)) << text;
  return error;
}

TEST(JobSubmission, ParsesEveryField) {
  std::string error;
  auto job = ParseJobSubmissionText(R"({
    "name": "train", "queue": "research", "priority": 5, "tasks": 2, "gpus": 0.5,
    "cpu": "500m", "memory": "2Gi", "gpu_model": ["H100-80GB", "A100-80GB"],
    "min_gpu_memory": "40Gi", "command": ["python3", "train.py"], "env": {"SEED": "1"},
    "workdir": "/tmp", "restartable": false, "preemptible": false, "max_runtime": "2h",
    "runtime_estimate": "30m", "grace_period": "2m"})",
                                    error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->name, "train");
  EXPECT_EQ(job->queue, "research");
  EXPECT_EQ(job->priority, 5);
  EXPECT_EQ(job->tasks, 2);
  EXPECT_EQ(job->gpu_milli_per_task, 500);
  EXPECT_EQ(job->cpu_milli_per_task, 500);
  EXPECT_EQ(job->memory_mib_per_task, 2048);
  EXPECT_EQ(job->gpu_models, (std::vector<std::string>{"H100-80GB", "A100-80GB"}));
  EXPECT_EQ(job->min_gpu_memory_mib, 40960);
  EXPECT_EQ(job->command, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(job->env.at("SEED"), "1");
  EXPECT_FALSE(job->restartable);
  EXPECT_FALSE(job->preemptible);
  EXPECT_EQ(job->max_runtime_ms, 7'200'000);
  EXPECT_EQ(job->runtime_estimate_ms, 1'800'000);
  EXPECT_EQ(job->grace_period_ms, 120'000);

  // What the server answers reads back as the same job.
  json shown = *job;
  auto again = ParseJobSubmission(shown, error);
  ASSERT_TRUE(again) << error << " in " << shown.dump();
  EXPECT_EQ(json(*again), shown);
}

TEST(JobSubmission, DefaultsToOneWholeGpu) {
  std::string error;
  auto job = ParseJobSubmissionText(R"({"command": ["nvidia-smi"]})", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->tasks, 1);
  EXPECT_EQ(job->gpu_milli_per_task, 1000);
  EXPECT_EQ(job->queue, "default");
  EXPECT_TRUE(job->restartable);
  EXPECT_EQ(job->grace_period_ms, 30'000);
}

// "nodes" asks for distinct nodes, tasks_per_node (default 1) tasks on each; they and "tasks"
// must agree, and survive a round trip as tasks and tasks_per_node.
TEST(JobSubmission, NodesAndTasksPerNode) {
  std::string error;
  auto job = ParseJobSubmissionText(R"({"command": ["x"], "nodes": 3})", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->tasks, 3);
  EXPECT_EQ(job->tasks_per_node, 1);
  job = ParseJobSubmissionText(R"({"command": ["x"], "nodes": 2, "tasks_per_node": 4})", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->tasks, 8);
  EXPECT_EQ(job->tasks_per_node, 4);
  const JobSubmission again = nlohmann::json(*job).get<JobSubmission>();
  EXPECT_EQ(again.tasks, 8);
  EXPECT_EQ(again.tasks_per_node, 4);
  job = ParseJobSubmissionText(R"({"command": ["x"], "tasks_per_node": 2})", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->tasks, 2);  // one node
  job = ParseJobSubmissionText(R"({"command": ["x"], "tasks": 4})", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->tasks_per_node, 0);  // anywhere, as before
  EXPECT_EQ(nlohmann::json(*job).count("tasks_per_node"), 0u);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "nodes": 2, "tasks": 3})")
                .find("'tasks' 3 is not 'nodes' 2 x 'tasks_per_node' 1"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "tasks": 3, "tasks_per_node": 2})")
                .find("'tasks' 3 is not a multiple of 'tasks_per_node' 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "nodes": 0})").find("'nodes' must be between"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "nodes": 1000, "tasks_per_node": 1000})")
                .find("more than 100000 tasks"),
            std::string::npos);
}

TEST(JobSubmission, NamesEachMistake) {
  EXPECT_NE(ErrorOf("{").find("malformed JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("[1]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "gpu": 1})").find("unknown field 'gpu'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"gpus": 1})").find("'command' is required"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": "python3 x.py"})").find("'command' must be a list"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "gpus": 1.5})").find("'gpus'"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "gpus": -1})").find("'gpus'"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "tasks": 0})").find("'tasks' must be between"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "tasks": "2"})").find("'tasks' must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "memory": "lots"})").find("'memory'"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "queue": "a b"})").find("'queue'"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "workdir": "rel"})").find("absolute"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "env": {"1A": "x"}})").find("invalid variable name"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "restartable": "yes"})").find("true or false"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "grace_period": "25h"})").find("at most 24h"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "grace_period": "soon"})").find("'grace_period'"),
            std::string::npos);
}

TEST(JobSubmission, ContainerFields) {
  std::string error;
  auto job = ParseJobSubmissionText(
      R"({"command": ["python3", "train.py"], "image": "localhost/train:1", "user": 1000,
          "mounts": ["/datasets:/data", {"source": "/ckpt", "target": "/ckpt", "read_only": false}]})",
      error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ(job->container.image, "localhost/train:1");
  EXPECT_EQ(job->container.user, "1000");
  ASSERT_EQ(job->container.mounts.size(), 2u);
  EXPECT_TRUE(job->container.mounts[0].read_only);
  EXPECT_FALSE(job->container.mounts[1].read_only);
  // Stored and read back unchanged.
  EXPECT_EQ(json(*job).get<JobSubmission>().container, job->container);

  EXPECT_NE(ErrorOf(R"({"command": ["x"], "mounts": ["/a:/b"]})").find("need an 'image'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "image": "i", "mounts": "/a:/b"})").find("list"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "image": "i", "mounts": [{"src": "/a"}]})")
                .find("unknown field 'src'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "image": "i", "user": "root"})").find("UID"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"command": ["x"], "image": 3})").find("'image' must be a string"),
            std::string::npos);
}

TEST(TaskLaunch, CarriesTheContainerApartFromThePlatformUser) {
  TaskLaunch launch;
  launch.user = "alice";  // the platform user, not the container's
  launch.argv = {"true"};
  launch.container = {"localhost/train:1", {{"/d", "/data", true}}, "1000:1000"};
  TaskLaunch back = json(launch).get<TaskLaunch>();
  EXPECT_EQ(back.user, "alice");
  EXPECT_EQ(back.container, launch.container);
  json bad = launch;
  bad["container"]["user"] = "alice";
  EXPECT_THROW(bad.get<TaskLaunch>(), nlohmann::json::exception);
}

TEST(JobRecord, RoundTrips) {
  JobRecord record;
  record.id = 42;
  record.user = "alice";
  record.team = "vision";
  record.spec.command = {"sleep", "1"};
  record.state = JobState::kRunning;
  record.attempt = 1;
  record.created_ms = 1000;
  record.started_ms = 2000;
  TaskStatus task;
  task.rank = 0;
  task.node = "node-1";
  task.gpu_indices = {2, 3};
  task.workload_id = "j42-r0-a1";
  task.state = "running";
  task.exit_code = 3;
  record.tasks.push_back(task);
  record.events.push_back({1000, "", "pending", "submitted"});
  record.exit_code = 3;
  json text = record;
  JobRecord back = text.get<JobRecord>();
  EXPECT_EQ(json(back), text);
  EXPECT_EQ(back.tasks.at(0).exit_code, 3);
  EXPECT_EQ(back.state, JobState::kRunning);
}

TEST(SyncMessages, RoundTrip) {
  SyncRequest request;
  request.node.name = "n1";
  GpuStatus gpu;
  gpu.index = 1;
  gpu.uuid = "GPU-1";
  gpu.model = "H100-80GB";
  request.node.gpus.push_back(gpu);
  WorkloadReport workload;
  workload.workload_id = "j1-r0-a0";
  workload.job_id = 1;
  workload.state = "exited";
  workload.exit_code = 0;
  request.workloads.push_back(workload);
  request.known_version = 7;
  request.wait_ms = 1000;
  json text = request;
  EXPECT_EQ(json(text.get<SyncRequest>()), text);

  SyncResponse response;
  response.version = 8;
  TaskLaunch launch;
  launch.workload_id = "j1-r0-a0";
  launch.argv = {"true"};
  launch.env = {{"RANK", "0"}};
  launch.gpu_indices = {0};
  launch.grace_period_ms = 90000;
  launch.checkpoint_dir = "/shared/ckpt/job-1";
  response.desired.push_back(launch);
  json answer = response;
  EXPECT_EQ(json(answer.get<SyncResponse>()), answer);
}

TEST(Names, StatesAndRoles) {
  for (auto state : {JobState::kPending, JobState::kRunning, JobState::kCancelled})
    EXPECT_EQ(ParseJobState(JobStateName(state)), state);
  EXPECT_FALSE(ParseJobState("done"));
  EXPECT_TRUE(IsTerminal(JobState::kFailed));
  EXPECT_FALSE(IsTerminal(JobState::kStarting));
  EXPECT_EQ(ParseRole("admin"), Role::kAdmin);
  EXPECT_FALSE(ParseRole("root"));
  EXPECT_EQ(FormatGpus(500), "0.5");
  EXPECT_EQ(FormatGpus(8000), "8");
  EXPECT_EQ(FormatGpus(125), "0.125");
}

}  // namespace
}  // namespace gpufleet::api
