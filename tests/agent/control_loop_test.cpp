// The agent's control loop against a fake server on loopback (a real net::HttpServer answering
// POST /api/v1/agents/sync with api::SyncRequest/SyncResponse, holding each sync as a long poll
// until its desired state changes): registration, the token, launches on exactly the desired
// GPUs with their environment, running and exit reports, cancels, failed launches, a server that
// fails and recovers, and an agent restart that re-adopts instead of relaunching. Real workloads
// run under the test shim on simulated GPUs. Nothing here asserts on durations: each wait has a
// generous deadline and the checks are on what the server received.

#include "agent/control_loop.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/prctl.h>
#include <unistd.h>

#include "agent/agent.h"
#include "api/json.h"
#include "api/types.h"
#include "core/version.h"
#include "executor_test_util.h"
#include "net/http_server.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using executor_testing::WaitUntil;
using ::testing::HasSubstr;

constexpr char kToken[] = "gpf_0123456789abcdef";

// What the server of docs/api.md does for one node, as far as the agent can tell: records every
// sync and answers with the desired tasks, at once when they are newer than the agent's
// known_version, else after wait_ms or when they change.
class FakeServer {
 public:
  struct Received {
    std::string authorization;
    api::SyncRequest request;
  };

  FakeServer() {
    net::HttpServerOptions options;
    options.io_threads = 4;  // held long polls block their thread: room for the short syncs
    options.stop_timeout = 2s;
    auto started = net::HttpServer::Start(
        options, [this](const net::HttpRequest& request) { return Handle(request); });
    EXPECT_TRUE(started.server) << started.error;
    server_ = std::move(started.server);
  }
  ~FakeServer() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
    server_.reset();
  }

  std::string url() const { return "http://" + server_->address(); }

  // Returns the new version.
  uint64_t SetDesired(std::vector<api::TaskLaunch> desired) {
    uint64_t version;
    {
      std::lock_guard lock(mutex_);
      desired_ = std::move(desired);
      version = ++version_;
    }
    changed_.notify_all();
    return version;
  }
  // 0: answer normally.
  void FailWith(int status) {
    std::lock_guard lock(mutex_);
    fail_status_ = status;
  }

  std::vector<Received> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  size_t count() const {
    std::lock_guard lock(mutex_);
    return received_.size();
  }
  // The first sync sent after the agent applied this version.
  std::optional<Received> FirstWithVersion(uint64_t version) const {
    std::lock_guard lock(mutex_);
    for (const Received& sync : received_)
      if (sync.request.known_version >= version) return sync;
    return std::nullopt;
  }
  // The latest report of a workload, from syncs after the first `from` ones.
  std::optional<api::WorkloadReport> Latest(const std::string& id, size_t from = 0) const {
    std::lock_guard lock(mutex_);
    for (size_t index = received_.size(); index > from; --index)
      for (const api::WorkloadReport& report : received_[index - 1].request.workloads)
        if (report.workload_id == id) return report;
    return std::nullopt;
  }
  // Whether any sync after the first `from` reported the workload in this state.
  bool Saw(const std::string& id, const std::string& state, size_t from = 0) const {
    std::lock_guard lock(mutex_);
    for (size_t index = from; index < received_.size(); ++index)
      for (const api::WorkloadReport& report : received_[index].request.workloads)
        if (report.workload_id == id && report.state == state) return true;
    return false;
  }

 private:
  net::HttpResponse Handle(const net::HttpRequest& http) {
    if (http.method != "POST" || http.path != "/api/v1/agents/sync")
      return net::HttpResponse::Error(404, "no such route");
    api::SyncRequest request;
    try {
      request = nlohmann::json::parse(http.body).get<api::SyncRequest>();
    } catch (const std::exception& error) {
      return net::HttpResponse::Error(400, error.what());
    }
    std::unique_lock lock(mutex_);
    received_.push_back({http.Header("Authorization"), request});
    if (http.Header("Authorization") != std::string("Bearer ") + kToken)
      return net::HttpResponse::Error(401, "unknown token");
    if (fail_status_ != 0) return net::HttpResponse::Error(fail_status_, "the store failed");
    changed_.wait_for(lock, std::chrono::milliseconds(request.wait_ms),
                      [&] { return released_ || version_ > request.known_version; });
    api::SyncResponse response;
    response.version = version_;
    response.desired = desired_;
    response.heartbeat_ms = 60'000;
    return net::HttpResponse::Json(200, nlohmann::json(response).dump());
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Received> received_;
  std::vector<api::TaskLaunch> desired_;
  uint64_t version_ = 1;
  int fail_status_ = 0;
  bool released_ = false;
  std::unique_ptr<net::HttpServer> server_;
};

class ControlLoopTest : public ::testing::Test {
 protected:
  // Shims are double-forked; as subreaper the test gets them back and reaps them.
  static void SetUpTestSuite() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

  void SetUp() override {
    root_ = executor_testing::FreshTestDir("loop");
    server_ = std::make_unique<FakeServer>();
  }

  void TearDown() override {
    loop_.reset();
    if (core_) {
      for (const WorkloadView& view : core_->List())
        if (!view.status.Finished()) core_->Cancel(view.status.id, 0);
      for (const WorkloadView& view : core_->List())
        WaitUntil([&] { return Ended(view.status.id); }, 10s);
    }
    core_.reset();
    server_.reset();
    executor_testing::ReapExitedChildren();
    fs::remove_all(root_);
  }

  void OpenCore() {
    AgentOptions options;
    options.data_dir = (root_ / "agent").string();
    options.sim_gpus = "8xH100-80GB";
    options.hostname = "node-a";
    options.start_sampler = false;
    options.shim_command = {GPUFLEET_TEST_SHIM};
    options.cgroup_mode = CgroupMode::kNone;
    // Workloads signal through files under root_, in the node's /tmp.
    options.workload_isolation = WorkloadIsolationMode::kNone;
    options.log = [this](const std::string& line) { Note(line); };
    auto opened = AgentCore::Open(std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    core_ = std::move(opened).value();
  }

  ControlLoopOptions LoopOptions() {
    ControlLoopOptions options;
    options.server_url = server_->url();
    options.token = kToken;
    options.address = "10.0.0.7";
    options.agent_url = "http://10.0.0.7:9400";
    options.rack = "rack-3";
    options.spine = "spine-1";
    // Far longer than any wait below: what is reported promptly comes from the watcher.
    options.wait_ms = 60'000;
    options.gc_interval_ms = 0;
    options.log = [this](const std::string& line) { Note(line); };
    return options;
  }

  void StartLoop(ControlLoopOptions options) {
    loop_ = std::make_unique<ControlLoop>(*core_, std::move(options));
    auto error = loop_->Start();
    ASSERT_FALSE(error) << *error;
  }

  void Note(const std::string& line) {
    std::lock_guard lock(log_mutex_);
    log_.push_back(line);
  }
  int LogLines(const std::string& text) {
    std::lock_guard lock(log_mutex_);
    return static_cast<int>(std::count_if(log_.begin(), log_.end(), [&](const std::string& line) {
      return line.find(text) != std::string::npos;
    }));
  }

  bool Ended(const std::string& id) {
    auto view = core_->Get(id);
    return !view.ok() || view.value().status.Finished() ||
           view.value().status.state == WorkloadState::kLost;
  }

  static api::TaskLaunch Task(const std::string& id, JobId job, std::vector<std::string> argv,
                              std::vector<int32_t> gpus) {
    api::TaskLaunch task;
    task.workload_id = id;
    task.job_id = job;
    task.argv = std::move(argv);
    task.gpu_indices = std::move(gpus);
    return task;
  }

  // A command that runs until the file `name` appears in the test's directory, then exits 3.
  std::vector<std::string> UntilFile(const std::string& name, const std::string& before = "") {
    const std::string path = (root_ / name).string();
    return {"sh", "-c", before + "while [ ! -e '" + path + "' ]; do sleep 0.02; done; exit 3"};
  }
  void Touch(const std::string& name) { executor_testing::WriteText(root_ / name, "go"); }

  fs::path root_;
  std::unique_ptr<FakeServer> server_;
  std::unique_ptr<AgentCore> core_;
  std::unique_ptr<ControlLoop> loop_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

TEST_F(ControlLoopTest, RegistersTheNodeWithItsGpusAndSendsTheToken) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  ASSERT_TRUE(WaitUntil([&] { return server_->count() >= 1; }, 10s));
  const FakeServer::Received first = server_->received().front();
  EXPECT_EQ(first.authorization, std::string("Bearer ") + kToken);
  const api::NodeReport& node = first.request.node;
  EXPECT_EQ(node.name, "node-a");
  EXPECT_EQ(node.address, "10.0.0.7");
  EXPECT_EQ(node.agent_url, "http://10.0.0.7:9400");
  EXPECT_EQ(node.backend, "sim");
  EXPECT_EQ(node.rack, "rack-3");
  EXPECT_EQ(node.spine, "spine-1");
  EXPECT_EQ(node.agent_version, kVersion);
  EXPECT_GT(node.cpu_milli, 0);
  EXPECT_GT(node.memory_mib, 0);
  ASSERT_EQ(node.gpus.size(), 8u);
  for (int32_t index = 0; index < 8; ++index) {
    const api::GpuStatus& gpu = node.gpus[index];
    const GpuInfo& info = core_->inventory().gpus[index];
    EXPECT_EQ(gpu.index, index);
    EXPECT_EQ(gpu.uuid, info.uuid);
    EXPECT_EQ(gpu.model, "H100-80GB");
    EXPECT_EQ(gpu.memory_mib, info.memory_total_mib);
    EXPECT_EQ(gpu.nvlink_island, info.nvlink_island);
    EXPECT_TRUE(gpu.healthy);
    EXPECT_GT(gpu.temperature_c, 0);  // telemetry from the latest sample
  }
  EXPECT_TRUE(first.request.workloads.empty());
  EXPECT_EQ(first.request.known_version, 0u);
  EXPECT_EQ(first.request.wait_ms, 60'000);
  // The server's version is applied and sent back in the next sync.
  ASSERT_TRUE(WaitUntil([&] { return server_->count() >= 2; }, 10s));
  EXPECT_EQ(server_->received()[1].request.known_version, 1u);
  EXPECT_TRUE(WaitUntil([&] { return loop_->Status().connected; }, 10s));
}

TEST_F(ControlLoopTest, LaunchesTheDesiredTaskOnItsGpusAndReportsRunningThenItsExit) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  api::TaskLaunch task = Task(
      "j7-r1-a2", 7, UntilFile("go", "echo $RANK $WORLD_SIZE $CUDA_VISIBLE_DEVICES; "), {5, 2});
  task.rank = 1;
  task.attempt = 2;
  task.env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  server_->SetDesired({task});

  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j7-r1-a2", "running"); }, 10s));
  auto view = core_->Get("j7-r1-a2");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view.value().spec.gpu_indices, (std::vector<int32_t>{5, 2}));
  EXPECT_EQ(view.value().spec.job_id, 7u);
  EXPECT_EQ(view.value().spec.task_index, 1);
  const api::WorkloadReport running = *server_->Latest("j7-r1-a2");
  EXPECT_EQ(running.job_id, 7u);
  EXPECT_EQ(running.rank, 1);
  EXPECT_EQ(running.attempt, 2);
  EXPECT_GT(running.started_ms, 0);

  // The server holds its long poll for a minute: the exit is reported by the watcher's sync.
  Touch("go");
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j7-r1-a2", "exited"); }, 20s));
  const api::WorkloadReport exited = *server_->Latest("j7-r1-a2");
  EXPECT_EQ(exited.exit_code, 3);
  EXPECT_EQ(exited.signal, std::nullopt);
  EXPECT_GT(exited.finished_ms, 0);
  auto logs = core_->Logs("j7-r1-a2", "stdout", std::nullopt);
  ASSERT_TRUE(logs.ok());
  EXPECT_EQ(logs.value(), "1 2 5,2\n");
  EXPECT_EQ(loop_->Status().launches, 1);
}

TEST_F(ControlLoopTest, TasksGetTheirGracePeriodAndACheckpointDirectoryThatOutlivesAnAttempt) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  // The agent's own directory when the server names none; the one given otherwise.
  api::TaskLaunch local_dir =
      Task("j11-r0-a0", 11, {"sh", "-c", "echo $GPUFLEET_CHECKPOINT_DIR"}, {0});
  local_dir.grace_period_ms = 120000;
  api::TaskLaunch shared_dir = Task(
      "j12-r0-a3", 12, {"sh", "-c", "echo saved > $GPUFLEET_CHECKPOINT_DIR/step; echo ok"}, {1});
  shared_dir.attempt = 3;
  shared_dir.checkpoint_dir = (root_ / "shared" / "job-12").string();
  server_->SetDesired({local_dir, shared_dir});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j11-r0-a0", "exited"); }, 20s));
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j12-r0-a3", "exited"); }, 20s));

  const std::string expected_local = core_->data_dir() + "/checkpoints/job-11";
  EXPECT_EQ(core_->Logs("j11-r0-a0", "stdout", std::nullopt).value(), expected_local + "\n");
  EXPECT_TRUE(fs::is_directory(expected_local));
  EXPECT_EQ(core_->Get("j11-r0-a0").value().spec.grace_period, 120000);
  EXPECT_EQ(core_->Get("j12-r0-a3").value().spec.grace_period, kDefaultGracePeriodMs);
  EXPECT_EQ(server_->Latest("j12-r0-a3")->exit_code, 0);
  std::ifstream saved(root_ / "shared" / "job-12" / "step");
  std::string line;
  std::getline(saved, line);
  EXPECT_EQ(line, "saved");
}

TEST_F(ControlLoopTest, SharesOfOneGpuRunSideBySideUpToAWholeGpu) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  const std::string say =
      "echo $CUDA_VISIBLE_DEVICES $GPUFLEET_GPU_SHARE $GPUFLEET_GPU_MEMORY_LIMIT_MIB; ";
  api::TaskLaunch half = Task("j21-r0-a0", 21, UntilFile("go", say), {3});
  half.gpu_milli = 500;
  api::TaskLaunch quarter = Task("j22-r0-a0", 22, UntilFile("go", say), {3});
  quarter.gpu_milli = 250;
  api::TaskLaunch too_much = Task("j23-r0-a0", 23, {"true"}, {3});
  too_much.gpu_milli = 500;
  server_->SetDesired({half, quarter});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j21-r0-a0", "running"); }, 10s));
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j22-r0-a0", "running"); }, 10s));
  // 500 + 250 + 500 is more than the GPU: the third fails to start, saying why.
  server_->SetDesired({half, quarter, too_much});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j23-r0-a0", "failed_to_start"); }, 10s));
  EXPECT_THAT(server_->Latest("j23-r0-a0")->error, ::testing::HasSubstr("250/1000 of its share"));
  EXPECT_EQ(core_->Get("j21-r0-a0").value().spec.gpu_milli, 500);

  Touch("go");
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j22-r0-a0", "exited"); }, 20s));
  // An H100-80GB has 81,559 MiB: half is 40,779, a quarter 20,389.
  EXPECT_EQ(core_->Logs("j21-r0-a0", "stdout", std::nullopt).value(), "3 0.500 40779\n");
  EXPECT_EQ(core_->Logs("j22-r0-a0", "stdout", std::nullopt).value(), "3 0.250 20389\n");
}

TEST_F(ControlLoopTest, CancelsWhatIsNoLongerDesiredAndLeavesLocalWorkloadsAlone) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  // A workload of `agent run` or the local API: no job, never the server's business.
  LaunchRequest local;
  local.id = "local";
  local.argv = UntilFile("local-go");
  local.gpu_indices = std::vector<int32_t>{0};
  ASSERT_TRUE(core_->Launch(local).ok());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  server_->SetDesired({Task("j8-r0-a0", 8, {"sleep", "600"}, {1})});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j8-r0-a0", "running"); }, 10s));

  server_->SetDesired({});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j8-r0-a0", "exited"); }, 20s));
  EXPECT_EQ(server_->Latest("j8-r0-a0")->signal, 15);  // SIGTERM, within the grace period
  EXPECT_TRUE(core_->Get("j8-r0-a0").value().status.cancelled);
  EXPECT_EQ(loop_->Status().cancels, 1);

  EXPECT_EQ(core_->Get("local").value().status.state, WorkloadState::kRunning);
  for (const FakeServer::Received& sync : server_->received())
    for (const api::WorkloadReport& report : sync.request.workloads)
      EXPECT_NE(report.workload_id, "local");
}

TEST_F(ControlLoopTest, LaunchesThatFailAreReportedAsFailedToStart) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  api::TaskLaunch missing_workdir = Task("j9-r1-a0", 9, {"true"}, {1});
  missing_workdir.workdir = (root_ / "no-such-dir").string();
  server_->SetDesired({Task("j9-r0-a0", 9, {"/no/such/program"}, {0}), missing_workdir,
                       Task("j9-r2-a0", 9, {"true"}, {42})});

  for (const char* id : {"j9-r0-a0", "j9-r1-a0", "j9-r2-a0"})
    ASSERT_TRUE(WaitUntil([&] { return server_->Saw(id, "failed_to_start"); }, 10s)) << id;
  EXPECT_THAT(server_->Latest("j9-r0-a0")->error, HasSubstr("/no/such/program"));
  EXPECT_THAT(server_->Latest("j9-r1-a0")->error, HasSubstr("no-such-dir"));
  // Refused before anything ran (no such GPU): reported all the same, and not retried.
  const api::WorkloadReport refused = *server_->Latest("j9-r2-a0");
  EXPECT_THAT(refused.error, HasSubstr("no GPU with index 42"));
  EXPECT_EQ(refused.job_id, 9u);
  EXPECT_EQ(refused.rank, 0);
  EXPECT_EQ(LogLines("task j9-r2-a0 of job 9 failed to start"), 1);
  EXPECT_FALSE(core_->Get("j9-r2-a0").ok());

  // Once the server drops them, the refused one is no longer reported.
  const uint64_t version = server_->SetDesired({});
  std::optional<FakeServer::Received> after;
  ASSERT_TRUE(
      WaitUntil([&] { return (after = server_->FirstWithVersion(version)).has_value(); }, 10s));
  for (const api::WorkloadReport& report : after->request.workloads)
    EXPECT_NE(report.workload_id, "j9-r2-a0");
}

// A deployment's replica: its readiness probe on its port decides `ready`, which is reported
// while the long poll is held; a port another program holds is refused before launch.
TEST_F(ControlLoopTest, ReplicasAreProbedForReadinessAndAPortInUseIsRefused) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ControlLoopOptions options = LoopOptions();
  options.address = "127.0.0.1";  // where the replica listens and is probed
  ASSERT_NO_FATAL_FAILURE(StartLoop(options));
  auto squatter = net::HttpServer::Start(net::HttpServerOptions{}, [](const net::HttpRequest&) {
    return net::HttpResponse::Text(200, "");
  });
  ASSERT_TRUE(squatter.server) << squatter.error;
  api::TaskLaunch blocked = Task("j31-r0-a0", 31, {"sleep", "60"}, {1});
  blocked.port = squatter.server->port();
  blocked.readiness_path = "/";
  // The replica listens on a free port once it has slept a little: not ready, then ready.
  auto probe = net::HttpServer::Start(net::HttpServerOptions{}, [](const net::HttpRequest&) {
    return net::HttpResponse::Text(200, "");
  });
  ASSERT_TRUE(probe.server);
  const int32_t port = probe.server->port();
  probe.server->Stop();
  api::TaskLaunch serving =
      Task("j30-r0-a0", 30,
           {"sh", "-c", "sleep 0.5; exec python3 -m http.server \"$PORT\" --bind 127.0.0.1"}, {0});
  serving.port = port;
  serving.readiness_path = "/";
  serving.env["PORT"] = std::to_string(port);
  server_->SetDesired({blocked, serving});

  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j31-r0-a0", "failed_to_start"); }, 10s));
  EXPECT_THAT(server_->Latest("j31-r0-a0")->error, HasSubstr("in use by another program"));
  EXPECT_FALSE(core_->Get("j31-r0-a0").ok());
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j30-r0-a0", "running"); }, 10s));
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto latest = server_->Latest("j30-r0-a0");
        return latest && latest->ready;
      },
      20s));
}

TEST_F(ControlLoopTest, SurvivesServerErrorsAndRecovers) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  server_->FailWith(500);
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  // Backing off (100 ms, 200 ms, 400 ms, ...) and trying again.
  ASSERT_TRUE(WaitUntil([&] { return server_->count() >= 3; }, 20s));
  ControlLoopStatus status = loop_->Status();
  EXPECT_FALSE(status.connected);
  EXPECT_THAT(status.last_error, HasSubstr("HTTP 500: the store failed"));
  EXPECT_EQ(LogLines("sync with the server failed"), 1);  // once, however often it fails

  server_->SetDesired({Task("j10-r0-a0", 10, UntilFile("go"), {3})});
  server_->FailWith(0);
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j10-r0-a0", "running"); }, 20s));
  EXPECT_TRUE(loop_->Status().connected);
  EXPECT_EQ(LogLines("again"), 1);
}

TEST_F(ControlLoopTest, AWrongTokenIsLoggedOnceWithAHint) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ControlLoopOptions options = LoopOptions();
  options.token = "gpf_wrong";
  ASSERT_NO_FATAL_FAILURE(StartLoop(options));
  ASSERT_TRUE(WaitUntil([&] { return server_->count() >= 3; }, 20s));
  EXPECT_EQ(server_->received().front().authorization, "Bearer gpf_wrong");
  EXPECT_EQ(LogLines("HTTP 401: unknown token (check the agent's token)"), 1);
}

TEST_F(ControlLoopTest, AServerThatIsDownIsRetried) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  const ControlLoopOptions options = LoopOptions();
  server_.reset();  // nothing listens there now
  ASSERT_NO_FATAL_FAILURE(StartLoop(options));
  ASSERT_TRUE(WaitUntil([&] { return !loop_->Status().last_error.empty(); }, 10s));
  EXPECT_EQ(LogLines("sync with the server failed"), 1);
  loop_->Stop();  // promptly, in the middle of a backoff
  EXPECT_FALSE(loop_->Status().running);
}

TEST_F(ControlLoopTest, ARestartedAgentReportsItsRunningWorkloadWithoutRelaunchingIt) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  server_->SetDesired({Task("j11-r0-a0", 11, UntilFile("go"), {4, 6})});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j11-r0-a0", "running"); }, 10s));
  const int32_t pid = core_->Get("j11-r0-a0").value().status.pid;

  // The agent goes away (its workload does not) and a new one starts over the same data dir.
  loop_->Stop();  // in the middle of a long poll
  loop_.reset();
  core_.reset();
  const size_t before = server_->count();
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  ASSERT_TRUE(WaitUntil([&] { return server_->count() >= before + 2; }, 10s));
  EXPECT_TRUE(server_->Saw("j11-r0-a0", "running", before));
  auto view = core_->Get("j11-r0-a0");
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view.value().adopted);
  EXPECT_EQ(view.value().status.pid, pid);
  EXPECT_EQ(view.value().spec.gpu_indices, (std::vector<int32_t>{4, 6}));
  EXPECT_EQ(loop_->Status().launches, 0);
  EXPECT_EQ(core_->List().size(), 1u);

  // Still watched by the new loop: its exit is reported.
  Touch("go");
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j11-r0-a0", "exited", before); }, 20s));
  EXPECT_EQ(server_->Latest("j11-r0-a0")->exit_code, 3);
}

TEST_F(ControlLoopTest, ATaskWaitsForTheGpusOfAWorkloadBeingCancelled) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ASSERT_NO_FATAL_FAILURE(StartLoop(LoopOptions()));
  // The first task ignores SIGTERM for a while, so its GPU stays taken after the cancel.
  const std::string stubborn = "trap 'sleep 0.5; exit 0' TERM; " + UntilFile("never")[2];
  server_->SetDesired({Task("j12-r0-a0", 12, {"sh", "-c", stubborn}, {2})});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j12-r0-a0", "running"); }, 10s));
  server_->SetDesired({Task("j13-r0-a0", 13, UntilFile("go"), {2})});
  ASSERT_TRUE(WaitUntil([&] { return server_->Saw("j13-r0-a0", "running"); }, 20s));
  EXPECT_FALSE(server_->Saw("j13-r0-a0", "failed_to_start"));
  EXPECT_EQ(LogLines("task j13-r0-a0 waits for GPU 2, still held by the cancelled workload j12"),
            1);
  EXPECT_TRUE(server_->Saw("j12-r0-a0", "exited"));
  EXPECT_EQ(loop_->Status().launch_failures, 0);
}

TEST_F(ControlLoopTest, FinishedWorkloadsTheServerDroppedAreForgottenPastTheLimit) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ControlLoopOptions options = LoopOptions();
  options.max_finished = 1;
  ASSERT_NO_FATAL_FAILURE(StartLoop(options));
  server_->SetDesired({Task("j14-r0-a0", 14, {"true"}, {}), Task("j15-r0-a0", 15, {"true"}, {})});
  ASSERT_TRUE(WaitUntil(
      [&] { return server_->Saw("j14-r0-a0", "exited") && server_->Saw("j15-r0-a0", "exited"); },
      20s));
  server_->SetDesired({});
  ASSERT_TRUE(WaitUntil([&] { return core_->List().size() == 1; }, 10s));
  EXPECT_EQ(loop_->Status().forgotten, 1);
}

TEST_F(ControlLoopTest, AServerUrlThatIsNotHttpIsRefused) {
  ASSERT_NO_FATAL_FAILURE(OpenCore());
  ControlLoopOptions options = LoopOptions();
  options.server_url = "ftp://example";
  ControlLoop loop(*core_, options);
  auto error = loop.Start();
  ASSERT_TRUE(error);
  EXPECT_THAT(*error, HasSubstr("--server"));
  EXPECT_EQ(server_->count(), 0u);
}

}  // namespace
}  // namespace gpufleet::agent
