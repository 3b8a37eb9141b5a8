// The client verbs' pure parts: job files and flags into a job, where the server and token come
// from, and how tables, ages and sizes are shown.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "cli/client.h"
#include "cli/cluster_commands.h"
#include "cli/deployment_commands.h"
#include "cli/job_commands.h"
#include "cli/table.h"

namespace gpufleet::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory under the test's temp dir, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = fs::temp_directory_path() / ("gpufleet-cli-test-" + std::to_string(random()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path Write(const fs::path& relative, const std::string& text) const {
    fs::path file = path_ / relative;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file;
  }

 private:
  fs::path path_;
};

// ---- Command groups ------------------------------------------------------------------------

// main builds only the group whose names hold argv[1]: a name missing from the list would still
// work (all groups are built then), but a listed name the group does not add would not.
template <typename Args, typename Names>
std::vector<std::string> AddedNames(void (*add)(CLI::App&, Args&), const Names& names) {
  CLI::App app;
  Args args;
  add(app, args);
  std::vector<std::string> added;
  for (const CLI::App* command : app.get_subcommands({}))
    added.push_back(command->get_name());
  EXPECT_EQ(added, std::vector<std::string>(std::begin(names), std::end(names)));
  return added;
}

TEST(CommandGroups, EachGroupAddsExactlyTheNamesMainLooksFor) {
  EXPECT_EQ(AddedNames(&AddJobCommands, kJobCommandNames).size(), 5u);
  EXPECT_EQ(AddedNames(&AddClusterCommands, kClusterCommandNames).size(), 7u);
  EXPECT_EQ(AddedNames(&AddDeploymentCommands, kDeploymentCommandNames).size(), 5u);
}

// ---- YAML job files -------------------------------------------------------------------------

TEST(JobFile, GoodFileBecomesTheApiJob) {
  TempDir dir;
  SubmitArgs args;
  args.file = dir.Write("job.yaml", R"(# a two-node training run
name: train-llama
queue: research
priority: 5
tasks: 2
gpus: 0.5
cpu: 4
memory: 16Gi
gpu_model: H100-80GB
command: [python3, train.py, --epochs, 10]
env:
  SEED: 1
  DEBUG: "true"
workdir: /data/run1
restartable: false
max_runtime: 2h
)")
                  .string();
  std::string error;
  auto submission = BuildSubmission(args, error);
  ASSERT_TRUE(submission) << error;
  const api::JobSubmission& job = submission->job;
  EXPECT_EQ(job.name, "train-llama");
  EXPECT_EQ(job.queue, "research");
  EXPECT_EQ(job.priority, 5);
  EXPECT_EQ(job.tasks, 2);
  EXPECT_EQ(job.gpu_milli_per_task, 500);
  EXPECT_EQ(job.cpu_milli_per_task, 4000);
  EXPECT_EQ(job.memory_mib_per_task, 16 * 1024);
  EXPECT_EQ(job.gpu_models, std::vector<std::string>{"H100-80GB"});
  // Words that look like numbers stay words in a command and in env values.
  EXPECT_EQ(job.command, (std::vector<std::string>{"python3", "train.py", "--epochs", "10"}));
  EXPECT_EQ(job.env.at("SEED"), "1");
  EXPECT_EQ(job.env.at("DEBUG"), "true");
  EXPECT_EQ(job.workdir, "/data/run1");
  EXPECT_FALSE(job.restartable);
  EXPECT_TRUE(job.preemptible);
  EXPECT_EQ(job.max_runtime_ms, 2 * 3600 * 1000);
  EXPECT_EQ(submission->body["gpus"], 0.5);
  EXPECT_EQ(submission->body["tasks"], 2);
}

TEST(JobFile, UnknownKeyIsNamedWithItsLine) {
  TempDir dir;
  SubmitArgs args;
  args.file = dir.Write("job.yaml", "command: [echo, hi]\ngpu: 2\n").string();
  std::string error;
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("job.yaml:2: unknown field 'gpu'"), std::string::npos) << error;
  EXPECT_NE(error.find("gpus"), std::string::npos) << error;  // the known fields are listed
}

TEST(JobFile, BadQuantityIsNamed) {
  TempDir dir;
  SubmitArgs args;
  args.file = dir.Write("job.yaml", "command: [echo]\nmemory: 16 gigs\n").string();
  std::string error;
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("job.yaml:2: 'memory' must be a non-negative quantity"), std::string::npos)
      << error;
}

TEST(JobFile, MalformedYamlSaysWhere) {
  std::string error;
  EXPECT_FALSE(JobYamlToJson("command: [echo\nname: x\n", "job.yaml", error));
  EXPECT_EQ(error.rfind("job.yaml:", 0), 0u) << error;
  EXPECT_FALSE(JobYamlToJson("- just\n- a list\n", "job.yaml", error));
  EXPECT_NE(error.find("must be a mapping"), std::string::npos) << error;
  EXPECT_FALSE(JobYamlToJson("", "job.yaml", error));
  EXPECT_NE(error.find("empty"), std::string::npos) << error;
}

TEST(JobFile, ARecursiveAliasIsAnErrorNotACrash) {
  // Found by tests/fuzz/fuzz_job_yaml: the YAML-to-JSON walk followed the alias forever.
  std::string error;
  EXPECT_FALSE(JobYamlToJson("command: &c [sh, *c]\ngpus: 1\n", "job.yaml", error));
  EXPECT_NE(error.find("job.yaml:1:"), std::string::npos) << error;
  EXPECT_NE(error.find("recursive alias"), std::string::npos) << error;
  // Bytes that are not UTF-8 were an uncaught exception once in JSON (found by fuzz_job_yaml).
  EXPECT_FALSE(JobYamlToJson("command: [sh]\ngpus: 3pm\xd3.x\n", "job.yaml", error));
  EXPECT_NE(error.find("job.yaml:2:"), std::string::npos) << error;
  EXPECT_NE(error.find("not valid UTF-8"), std::string::npos) << error;
  EXPECT_TRUE(JobYamlToJson("name: caf\xc3\xa9\ncommand: [sh]\n", "job.yaml", error)) << error;
  // Honest nesting well inside the limit still reads.
  EXPECT_TRUE(JobYamlToJson("env: {A: [[[[1]]]]}\n", "job.yaml", error)) << error;
}

TEST(JobFile, PlainScalarsAreTyped) {
  std::string error;
  auto job = JobYamlToJson(
      "priority: -3\ngpus: 1.5\npreemptible: false\nname: 007\nqueue: 'x'\n"
      "runtime_estimate: ~\n",
      "job.yaml", error);
  ASSERT_TRUE(job) << error;
  EXPECT_EQ((*job)["priority"], -3);
  EXPECT_EQ((*job)["gpus"], 1.5);
  EXPECT_EQ((*job)["preemptible"], false);
  EXPECT_EQ((*job)["name"], "007");
  EXPECT_EQ((*job)["queue"], "x");
  EXPECT_TRUE((*job)["runtime_estimate"].is_null());
}

TEST(JobFile, FlagsOverrideTheFile) {
  TempDir dir;
  SubmitArgs args;
  args.file =
      dir.Write("job.yaml", "command: [train]\nqueue: research\ngpus: 8\nenv: {A: '1', B: '2'}\n")
          .string();
  args.queue = "urgent";
  args.env = {"B=3"};
  args.command = {"eval", "--fast"};
  std::string error;
  auto submission = BuildSubmission(args, error);
  ASSERT_TRUE(submission) << error;
  EXPECT_EQ(submission->job.queue, "urgent");
  EXPECT_EQ(submission->job.gpu_milli_per_task, 8000);  // from the file
  EXPECT_EQ(submission->job.env.at("A"), "1");
  EXPECT_EQ(submission->job.env.at("B"), "3");
  EXPECT_EQ(submission->job.command, (std::vector<std::string>{"eval", "--fast"}));
}

TEST(JobFile, MissingFileIsReported) {
  SubmitArgs args;
  args.file = "/nonexistent/job.yaml";
  std::string error;
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("cannot read job file '/nonexistent/job.yaml'"), std::string::npos) << error;
}

// ---- Flags -----------------------------------------------------------------------------------

TEST(SubmitFlags, BuildTheJob) {
  SubmitArgs args;
  args.gpus = "0.5";
  args.nodes = 4;
  args.gpu_models = {"A100-80GB", "H100-80GB"};
  args.priority = 10;
  args.cpu = "500m";
  args.memory = "2Gi";
  args.env = {"SEED=1", "EMPTY=", "EQ=a=b"};
  args.max_runtime = "90m";
  args.no_restart = true;
  args.not_preemptible = true;
  args.command = {"python3", "train.py"};
  std::string error;
  auto submission = BuildSubmission(args, error);
  ASSERT_TRUE(submission) << error;
  const api::JobSubmission& job = submission->job;
  EXPECT_EQ(job.gpu_milli_per_task, 500);
  EXPECT_EQ(job.tasks, 4);
  EXPECT_EQ(job.gpu_models.size(), 2u);
  EXPECT_EQ(job.priority, 10);
  EXPECT_EQ(job.cpu_milli_per_task, 500);
  EXPECT_EQ(job.memory_mib_per_task, 2048);
  EXPECT_EQ(job.env.at("SEED"), "1");
  EXPECT_EQ(job.env.at("EMPTY"), "");
  EXPECT_EQ(job.env.at("EQ"), "a=b");
  EXPECT_EQ(job.max_runtime_ms, 90 * 60 * 1000);
  EXPECT_FALSE(job.restartable);
  EXPECT_FALSE(job.preemptible);
  EXPECT_EQ(job.queue, "default");
  EXPECT_EQ(submission->body["gpus"], 0.5);
}

TEST(SubmitFlags, BadEnvIsRefused) {
  std::string error;
  EXPECT_FALSE(ParseEnvFlags({"GOOD=1", "NOEQUALS"}, error));
  EXPECT_EQ(error, "--env 'NOEQUALS': expected NAME=VALUE");
  EXPECT_FALSE(ParseEnvFlags({"=value"}, error));

  SubmitArgs args;
  args.command = {"true"};
  args.env = {"1BAD=x"};  // the API's own rule for names, reported against the flag
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("--env: 'env' has an invalid variable name '1BAD'"), std::string::npos)
      << error;
}

TEST(SubmitFlags, BadValuesNameTheFlag) {
  std::string error;
  SubmitArgs args;
  args.command = {"true"};
  args.gpus = "half";
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("--gpus 'half'"), std::string::npos) << error;

  args.gpus.reset();
  args.memory = "lots";
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("--memory 'lots'"), std::string::npos) << error;

  args.memory.reset();
  args.nodes = 0;
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("--nodes 0"), std::string::npos) << error;

  args.nodes.reset();
  args.queue = "no spaces";
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("--queue: 'queue' must be"), std::string::npos) << error;
}

TEST(SubmitFlags, NoCommandIsRefused) {
  SubmitArgs args;
  args.gpus = "1";
  std::string error;
  EXPECT_FALSE(BuildSubmission(args, error));
  EXPECT_NE(error.find("no command"), std::string::npos) << error;
}

TEST(SubmitFlags, RelativeWorkdirIsMadeAbsolute) {
  SubmitArgs args;
  args.command = {"true"};
  args.workdir = "runs/1/";
  std::string error;
  auto submission = BuildSubmission(args, error);
  ASSERT_TRUE(submission) << error;
  EXPECT_EQ(submission->job.workdir, (fs::current_path() / "runs/1").string());
}

TEST(SubmitFlags, SummaryLine) {
  api::JobRecord record;
  record.spec.tasks = 2;
  record.spec.gpu_milli_per_task = 1000;
  EXPECT_EQ(DescribeSubmitted(record), "pending (queue default, 2 x 1 GPU)");
  record.spec.tasks = 1;
  record.spec.gpu_milli_per_task = 500;
  record.spec.queue = "research";
  EXPECT_EQ(DescribeSubmitted(record), "pending (queue research, 1 x 0.5 GPU)");
  record.spec.gpu_milli_per_task = 8000;
  EXPECT_EQ(DescribeSubmitted(record), "pending (queue research, 1 x 8 GPUs)");
}

// ---- Where the server and token come from ----------------------------------------------------

TEST(Config, FlagBeatsEnvBeatsProjectFileBeatsUserFile) {
  TempDir dir;
  const fs::path project = dir.path() / "repo";
  const fs::path nested = project / "a" / "b";
  fs::create_directories(nested);
  dir.Write("repo/.gpufleet/client.json",
            R"({"server": "http://project:1", "token": "project-token"})");
  const fs::path user = dir.Write("home/gpufleet/client.json",
                                  R"({"server": "http://user:2", "token": "user-token"})");

  ConfigSources sources;
  sources.cwd = nested;  // the project file is two levels up
  sources.user_config = user;
  std::string error;

  auto config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://project:1");
  EXPECT_EQ(config->token, "project-token");
  EXPECT_EQ(config->token_source, (project / ".gpufleet/client.json").string());

  sources.env_server = "http://env:3";
  sources.env_token = "env-token";
  config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://env:3");
  EXPECT_EQ(config->token, "env-token");
  EXPECT_EQ(config->token_source, "GPUFLEET_TOKEN");

  sources.flag_server = "http://flag:4/";
  sources.flag_token = "flag-token";
  config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://flag:4");  // trailing slash dropped
  EXPECT_EQ(config->token, "flag-token");
  EXPECT_EQ(config->server_source, "--server");

  // Outside the project only the user's file is left.
  sources = ConfigSources{};
  sources.cwd = dir.path();
  sources.user_config = user;
  config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://user:2");
  EXPECT_EQ(config->token, "user-token");
}

TEST(Config, EachFieldFallsThroughOnItsOwn) {
  TempDir dir;
  dir.Write(".gpufleet/client.json", R"({"token": "project-token"})");
  ConfigSources sources;
  sources.cwd = dir.path();
  sources.env_server = "127.0.0.1:9000";  // no scheme: http:// is assumed
  std::string error;
  auto config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://127.0.0.1:9000");
  EXPECT_EQ(config->token, "project-token");
}

TEST(Config, EachServerOfAListIsNormalisedAndAnEmptyOneIsKeptForTheClientToRefuse) {
  TempDir dir;
  ConfigSources sources;
  sources.cwd = dir.path();
  sources.flag_server = "127.0.0.1:8080/,https://b:9443//,,c:1";
  sources.flag_token = "t";
  std::string error;
  auto config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://127.0.0.1:8080,https://b:9443,,http://c:1");
}

TEST(Config, DefaultsAndMissingToken) {
  TempDir dir;
  ConfigSources sources;
  sources.cwd = dir.path();
  sources.user_config = dir.path() / "absent.json";
  std::string error;
  auto config = ResolveConfig(sources, error);
  ASSERT_TRUE(config) << error;
  EXPECT_EQ(config->server, "http://127.0.0.1:8080");
  EXPECT_EQ(config->server_source, "default");
  EXPECT_TRUE(config->token.empty());
  // A 401 without a token says how to get one.
  const std::string message = DescribeHttpError(*config, 401, R"({"error": "no token"})");
  EXPECT_NE(message.find("no token"), std::string::npos);
  EXPECT_NE(message.find("GPUFLEET_TOKEN"), std::string::npos);
  EXPECT_NE(message.find("gpufleet dev"), std::string::npos);
  EXPECT_NE(message.find("gpufleet token create"), std::string::npos);
}

TEST(Config, BrokenFileIsNamed) {
  TempDir dir;
  const fs::path file = dir.Write(".gpufleet/client.json", "{not json");
  ConfigSources sources;
  sources.cwd = dir.path();
  std::string error;
  EXPECT_FALSE(ResolveConfig(sources, error));
  EXPECT_NE(error.find(file.string()), std::string::npos) << error;
  // Not read at all when flags already say everything.
  sources.flag_server = "http://x:1";
  sources.flag_token = "t";
  EXPECT_TRUE(ResolveConfig(sources, error));
}

TEST(Errors, ApiMessageAndUnreachableServer) {
  ClientConfig config{"http://127.0.0.1:1", "t", "--server", "--token", ""};
  EXPECT_EQ(DescribeHttpError(config, 404, R"({"error": "no job 42"})"), "no job 42");
  EXPECT_EQ(DescribeHttpError(config, 502, "Bad Gateway"),
            "the server answered HTTP 502: Bad Gateway");
  const std::string unreachable = DescribeTransportError(
      config, "GET http://127.0.0.1:1/api/v1/jobs: connect: Connection refused");
  EXPECT_EQ(unreachable,
            "cannot reach the gpufleet server at http://127.0.0.1:1: connect: Connection refused "
            "(is it running? start one with 'gpufleet dev'; the URL came from --server)");
}

TEST(Errors, UrlEncode) {
  EXPECT_EQ(UrlEncode("gpu-07.rack_1~"), "gpu-07.rack_1~");
  EXPECT_EQ(UrlEncode("a b/c&d"), "a%20b%2Fc%26d");
}

TEST(Errors, ListInAcceptsBareArraysAndWrappedOnes) {
  EXPECT_EQ(ListIn(json::parse(R"([1, 2])"), "jobs").size(), 2u);
  EXPECT_EQ(ListIn(json::parse(R"({"jobs": [1]})"), "jobs").size(), 1u);
  EXPECT_TRUE(ListIn(json::parse(R"({"other": [1]})"), "jobs").empty());
}

// ---- Tables and formats ----------------------------------------------------------------------

TEST(Table, AlignsAndTruncates) {
  Table table({{"ID", 0, true}, {"NAME", 8}, {"NOTE"}});
  table.Add({"7", "short", "x"});
  table.Add({"1234", "a-very-long-name", ""});
  table.Add({"5", "line\nbreak"});
  EXPECT_EQ(table.Render(),
            "  ID  NAME      NOTE\n"
            "   7  short     x\n"
            "1234  a-ver...\n"
            "   5  line ...\n");
}

TEST(Table, TruncateCountsCodePoints) {
  EXPECT_EQ(Truncate("héllo wörld", 8), "héllo...");
  EXPECT_EQ(DisplayWidth("héllo"), 5u);
  EXPECT_EQ(Truncate("abc", 3), "abc");
  EXPECT_EQ(Truncate("abcdef", 2), "..");
}

TEST(Format, Age) {
  const TimeMs now = 1'700'000'000'000;
  auto ago = [now](int64_t seconds) { return FormatAge(now - seconds * 1000, now); };
  EXPECT_EQ(FormatAge(0, now), "-");
  EXPECT_EQ(ago(-5), "0s");  // the server's clock ahead of ours
  EXPECT_EQ(ago(0), "0s");
  EXPECT_EQ(ago(45), "45s");
  EXPECT_EQ(ago(119), "119s");
  EXPECT_EQ(ago(200), "3m20s");
  EXPECT_EQ(ago(300), "5m");
  EXPECT_EQ(ago(17 * 60 + 5), "17m");
  EXPECT_EQ(ago(5 * 3600 + 30 * 60), "5h30m");
  EXPECT_EQ(ago(20 * 3600), "20h");
  EXPECT_EQ(ago(3 * 86400 + 4 * 3600), "3d4h");
  EXPECT_EQ(ago(40 * 86400), "40d");
  EXPECT_EQ(ago(3 * 365 * 86400), "3y");
}

TEST(Format, Quantities) {
  EXPECT_EQ(FormatDuration(2 * 3600 * 1000), "2h");
  EXPECT_EQ(FormatDuration(90 * 60 * 1000), "1h30m");
  EXPECT_EQ(FormatDuration(45'000), "45s");
  EXPECT_EQ(FormatDuration(500), "500ms");
  EXPECT_EQ(FormatDuration(1500), "1.5s");
  EXPECT_EQ(FormatMemory(16 * 1024), "16Gi");
  EXPECT_EQ(FormatMemory(512), "512Mi");
  EXPECT_EQ(FormatMemory(1024 * 1024), "1Ti");
  EXPECT_EQ(FormatMemory(515'000), "502.9Gi");
  EXPECT_EQ(FormatCpu(4000), "4");
  EXPECT_EQ(FormatCpu(500), "500m");
  EXPECT_EQ(FormatCpu(1500), "1.5");
  EXPECT_EQ(FormatGpuCount(1000), "1 GPU");
  EXPECT_EQ(FormatGpuCount(250), "0.25 GPU");
  EXPECT_EQ(FormatGpuCount(0), "0 GPUs");
}

TEST(Table, JobsShowReasonOnlyWhenItMatters) {
  const TimeMs now = 1'700'000'000'000;
  api::JobRecord pending;
  pending.id = 42;
  pending.user = "alice";
  pending.team = "vision";
  pending.spec.command = {"/usr/bin/python3", "train.py"};
  pending.spec.tasks = 2;
  pending.created_ms = now - 90'000;
  pending.reason = "waiting for 2 nodes with 1 free GPU each: " + std::string(100, 'x');
  api::JobRecord running = pending;
  running.id = 7;
  running.spec.name = "eval";
  running.state = api::JobState::kRunning;
  running.reason = "should not show";
  const std::string table = JobsTable({pending, running}, now);
  EXPECT_NE(table.find("ID  NAME     USER   TEAM    QUEUE    STATE    GPUS  NODES  AGE  REASON"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("42  python3  alice  vision  default  pending     1      2  90s  waiting"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("xxx...\n"), std::string::npos) << table;
  EXPECT_EQ(table.find("should not show"), std::string::npos) << table;
}

TEST(Table, DeploymentsAndShow) {
  const TimeMs now = 1'700'000'000'000;
  api::DeploymentRecord record;
  record.name = "tiny-llm";
  record.team = "vision";
  record.user = "alice";
  record.created_ms = now - 120'000;
  record.spec.command = {"python3", "serve.py"};
  record.spec.gpu_milli_per_replica = 500;
  record.spec.min_replicas = 0;
  record.spec.max_replicas = 3;
  record.spec.autoscaling.target = 4;
  record.generation = 2;
  record.desired_replicas = 2;
  record.ready_replicas = 1;
  record.desired_reason = "panic mode";
  api::ReplicaStatus ready;
  ready.job_id = 7;
  ready.generation = 2;
  ready.state = "ready";
  ready.node = "gpu-01";
  ready.host = "10.0.0.1";
  ready.port = 30123;
  ready.created_ms = now - 60'000;
  api::ReplicaStatus pending = ready;
  pending.job_id = 8;
  pending.state = "pending";
  pending.node = "";
  pending.port = 0;
  record.replicas = {ready, pending};
  const std::string table = DeploymentsTable({record}, now);
  EXPECT_NE(table.find("tiny-llm  vision    1/2  0-3 (concurrency 4)           0.5  "
                       "least_outstanding    2   2m  panic mode"),
            std::string::npos)
      << table;
  const std::string shown = ShowDeployment(record, now);
  EXPECT_NE(shown.find("Replicas:     1 ready of 2 wanted (panic mode)"), std::string::npos)
      << shown;
  EXPECT_NE(shown.find("  7    2  ready    gpu-01  10.0.0.1:30123  60s"), std::string::npos)
      << shown;
  EXPECT_NE(shown.find("  8    2  pending  -       -"), std::string::npos) << shown;
}

TEST(Table, NodesAndTop) {
  const TimeMs now = 1'700'000'000'000;
  api::NodeRecord node;
  node.report.name = "gpu-01";
  node.report.backend = "sim";
  node.report.cpu_milli = 64'000;
  node.report.memory_mib = 512 * 1024;
  for (int i = 0; i < 2; ++i) {
    api::GpuStatus gpu;
    gpu.index = i;
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81920;
    gpu.memory_used_mib = i == 0 ? 40960 : 0;
    gpu.utilization_pct = i == 0 ? 97.4 : 0;
    gpu.healthy = i == 0;
    gpu.health_reason = i == 0 ? "" : "XID 79";
    node.report.gpus.push_back(gpu);
  }
  node.gpu_jobs[0] = {42, 43};
  node.last_seen_ms = now - 3000;
  const std::string nodes = NodesTable({node}, now);
  EXPECT_NE(nodes.find("gpu-01  ready  1/2 (1 unhealthy)  H100-80GB  sim       64  512Gi  3s"),
            std::string::npos)
      << nodes;

  api::QueueStatus queue;
  queue.name = "default";
  queue.pending = 3;
  queue.running = 1;
  queue.gpu_milli_pending = 2500;
  const std::string frame = TopFrame({node}, {queue}, "http://x:1", now, 0);
  EXPECT_NE(frame.find("GPUs: 2 (1 in use, 1 unhealthy)"), std::string::npos) << frame;
  EXPECT_NE(frame.find("jobs: 1 running, 3 pending (asking for 2.5 GPUs)"), std::string::npos)
      << frame;
  EXPECT_NE(frame.find("gpu-01    0  H100-80GB   97%  40.0/80.0Gi"), std::string::npos) << frame;
  EXPECT_NE(frame.find("42,43"), std::string::npos) << frame;
  EXPECT_NE(frame.find("UNHEALTHY: XID 79"), std::string::npos) << frame;
  // A short terminal shows what fits and says what does not.
  const std::string short_frame = TopFrame({node}, {queue}, "http://x:1", now, 1);
  EXPECT_NE(short_frame.find("... 1 more GPU(s)"), std::string::npos) << short_frame;
}

TEST(Usage, SinceIsASpanBackFromNowOrAUtcDate) {
  std::string error;
  const TimeMs now = 1'764'720'000'000;  // 2025-12-03 00:00 UTC
  EXPECT_EQ(ParseSince("7d", now, error), now - 7 * 24 * 3'600'000);
  EXPECT_EQ(ParseSince("24h", now, error), now - 24 * 3'600'000);
  EXPECT_EQ(ParseSince("90m", now, error), now - 90 * 60'000);
  EXPECT_EQ(ParseSince("2025-12-01", now, error), now - 2 * 24 * 3'600'000);
  EXPECT_EQ(ParseSince("100000d", now, error), 0);  // before the epoch: from the start
  for (const char* bad : {"", "yesterday", "-1h", "0s", "2025-13-01", "2025-12-01x"}) {
    EXPECT_EQ(ParseSince(bad, now, error), std::nullopt) << bad;
    EXPECT_NE(error.find("7d, 24h"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace gpufleet::cli
