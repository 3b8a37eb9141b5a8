// The agent daemon in-process: AgentCore with 8 simulated GPUs (or the fake NVML) behind the real
// HTTP server on a loopback port 0, driven through the HTTP client: /metrics, fault injection and
// health, workload launch/cancel/logs with GPU bookkeeping, and re-adoption after a restart.

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/prctl.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/agent_api.h"
#include "agent/gpu_metrics.h"
#include "executor_test_util.h"
#include "net/http_client.h"
#include "net/http_server.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using executor_testing::WaitUntil;
using ::testing::HasSubstr;
using Json = nlohmann::json;

struct Metric {
  std::string labels;  // everything between the braces
  double value = 0;
};

// The series of one metric family by GPU index (series without a gpu label under -1).
std::map<int, std::vector<Metric>> Series(const std::string& text, const std::string& name) {
  std::map<int, std::vector<Metric>> series;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t close = line.rfind('}');
    Metric metric;
    metric.labels = line.substr(name.size() + 1, close - name.size() - 1);
    metric.value = std::stod(line.substr(close + 2));
    int gpu = -1;
    if (metric.labels.rfind("gpu=\"", 0) == 0) gpu = std::stoi(metric.labels.substr(5));
    series[gpu].push_back(metric);
  }
  return series;
}

class AgentDaemonTest : public ::testing::Test {
 protected:
  // Shims are double-forked; as subreaper the test gets them back and reaps them.
  static void SetUpTestSuite() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

  void SetUp() override { root_ = executor_testing::FreshTestDir("agent"); }

  void TearDown() override {
    if (core_) {
      for (const WorkloadView& view : core_->List())
        if (!view.status.Finished()) core_->Cancel(view.status.id, 0);
      for (const WorkloadView& view : core_->List())
        WaitFinished(view.status.id);
    }
    StopAgent();
    executor_testing::ReapExitedChildren();
    fs::remove_all(root_);
  }

  AgentOptions SimOptions() {
    AgentOptions options;
    options.data_dir = (root_ / "agent").string();
    options.sim_gpus = "8xH100-80GB";
    options.hostname = "node-a";
    options.start_sampler = false;  // the tests sample with SampleNow(): no timing involved
    options.shim_command = {GPUFLEET_TEST_SHIM};
    options.cgroup_mode = CgroupMode::kNone;  // limits are the executor tests' business
    // Workloads signal through files under root_, in the node's /tmp.
    options.workload_isolation = WorkloadIsolationMode::kNone;
    options.log = [this](const std::string& line) {
      std::lock_guard lock(log_mutex_);
      log_.push_back(line);
    };
    return options;
  }

  void StartAgent(AgentOptions options, AgentApiOptions api_options = {}) {
    auto opened = AgentCore::Open(std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    core_ = std::move(opened).value();
    router_ = std::make_unique<net::Router>(MakeAgentRouter(*core_, std::move(api_options)));
    auto started = net::HttpServer::Start(
        {}, [this](const net::HttpRequest& request) { return router_->Handle(request); });
    ASSERT_TRUE(started.server) << started.error;
    server_ = std::move(started.server);
  }

  void StopAgent() {
    server_.reset();
    router_.reset();
    core_.reset();
  }

  std::string Url(const std::string& target) const {
    return "http://" + server_->address() + target;
  }

  net::HttpClientResponse Get(const std::string& target) {
    net::HttpResult result = net::HttpGet(Url(target), 5s);
    EXPECT_TRUE(result.ok()) << result.error;
    return result.response.value_or(net::HttpClientResponse{});
  }

  net::HttpClientResponse Post(const std::string& target, const std::string& body) {
    net::HttpResult result = net::HttpPost(Url(target), body, 15s);
    EXPECT_TRUE(result.ok()) << result.error;
    return result.response.value_or(net::HttpClientResponse{});
  }

  Json GetJson(const std::string& target) { return Json::parse(Get(target).body); }

  Json WaitFinished(const std::string& id) {
    Json last;
    WaitUntil(
        [&] {
          last = GetJson("/v1/workloads/" + id);
          const std::string state = last.value("state", "");
          return state == "exited" || state == "failed_to_start";
        },
        10s);
    return last;
  }

  bool LogContains(const std::string& text) {
    std::lock_guard lock(log_mutex_);
    return std::any_of(log_.begin(), log_.end(), [&](const std::string& line) {
      return line.find(text) != std::string::npos;
    });
  }

  fs::path root_;
  std::unique_ptr<AgentCore> core_;
  std::unique_ptr<net::Router> router_;
  std::unique_ptr<net::HttpServer> server_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

TEST_F(AgentDaemonTest, AManagedAgentsApiWantsItsKeyOnEveryWorkloadRoute) {
  AgentApiOptions api_options;
  api_options.standalone = false;
  api_options.api_key = NewApiKey();
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions(), api_options));
  const std::string launch = R"({"argv": ["true"], "gpus": [0]})";
  auto call = [&](const std::string& method, const std::string& target,
                  const std::string& authorization) {
    net::HttpCallOptions options;
    options.body = method == "POST" ? launch : "";
    if (!authorization.empty()) options.headers.emplace_back("Authorization", authorization);
    net::HttpResult result = net::HttpCall(method, Url(target), options);
    EXPECT_TRUE(result.ok()) << result.error;
    return result.response.value_or(net::HttpClientResponse{});
  };
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"GET", "/v1/gpus"},
      {"POST", "/v1/workloads"},
      {"GET", "/v1/workloads"},
      {"GET", "/v1/workloads/w1"},
      {"POST", "/v1/workloads/w1/cancel"},
      {"GET", "/v1/workloads/w1/logs"},
      {"POST", "/v1/sim/faults"}};
  for (const auto& [method, target] : routes) {
    SCOPED_TRACE(method + " " + target);
    net::HttpClientResponse missing = call(method, target, "");
    EXPECT_EQ(missing.status, 401);
    EXPECT_EQ(missing.Header("WWW-Authenticate"), "Bearer");
    EXPECT_THAT(missing.body, HasSubstr("needs the agent's key"));
    EXPECT_EQ(call(method, target, "Bearer gpa_" + std::string(64, '0')).status, 401);
    EXPECT_EQ(call(method, target, "Basic " + api_options.api_key).status, 401);
  }
  EXPECT_TRUE(core_->List().empty()) << "a refused launch started nothing";
  // The key opens them all; telemetry stays open to scrapers.
  EXPECT_EQ(call("GET", "/v1/gpus", "Bearer " + api_options.api_key).status, 200);
  net::HttpClientResponse launched = call("POST", "/v1/workloads", "Bearer " + api_options.api_key);
  EXPECT_EQ(launched.status, 201) << launched.body;
  EXPECT_EQ(core_->List().size(), 1u);
  EXPECT_EQ(Get("/healthz").status, 200);
  net::HttpClientResponse metrics = Get("/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.body, HasSubstr("gpufleet_agent_api_refused_total{reason=\"no_credentials\"} "
                                      "14\n"));
  EXPECT_THAT(metrics.body,
              HasSubstr("gpufleet_agent_api_refused_total{reason=\"wrong_key\"} 7\n"));
  EXPECT_EQ(Json::parse(Get("/healthz").body).value("api_authentication", ""), "agent key");
  const std::string id = Json::parse(launched.body).value("id", "");
  net::HttpCallOptions authorized;
  authorized.headers.emplace_back("Authorization", "Bearer " + api_options.api_key);
  WaitUntil(
      [&] {
        auto result = net::HttpCall("GET", Url("/v1/workloads/" + id), authorized);
        return result.ok() && Json::parse(result.response->body).value("state", "") == "exited";
      },
      10s);
  // TearDown reads workloads without the key.
  EXPECT_FALSE(core_->Forget(id).has_value());
}

TEST_F(AgentDaemonTest, TheApiKeyFileIsPrivateAndReadsBack) {
  const std::string path = (root_ / "api-key").string();
  fs::create_directories(root_);
  const std::string key = NewApiKey();
  ASSERT_EQ(key.size(), 4u + 64u);
  EXPECT_NE(key, NewApiKey());
  ASSERT_EQ(WriteApiKeyFile(path, key), std::nullopt);
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  std::string error;
  EXPECT_EQ(ReadApiKeyFile(path, error), key);
  EXPECT_EQ(ReadApiKeyFile((root_ / "absent").string(), error), std::nullopt);
  EXPECT_THAT(error, HasSubstr("cannot read"));
}

TEST_F(AgentDaemonTest, MetricsHaveDcgmNamesAndLabelsForEightSimulatedGpus) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  net::HttpClientResponse metrics = Get("/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");

  auto utilization = Series(metrics.body, "DCGM_FI_DEV_GPU_UTIL");
  ASSERT_EQ(utilization.size(), 8u);
  const std::vector<GpuInfo>& gpus = core_->inventory().gpus;
  for (int gpu = 0; gpu < 8; ++gpu) {
    ASSERT_EQ(utilization[gpu].size(), 1u);
    EXPECT_EQ(utilization[gpu][0].labels,
              "gpu=\"" + std::to_string(gpu) + "\",UUID=\"" + gpus[gpu].uuid + "\",pci_bus_id=\"" +
                  gpus[gpu].pci_bus_id + "\",device=\"nvidia" + std::to_string(gpu) +
                  "\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\","
                  "DCGM_FI_DRIVER_VERSION=\"sim-0.1.0\"");
    EXPECT_EQ(utilization[gpu][0].value, 0);  // idle
  }
  EXPECT_EQ(Series(metrics.body, "DCGM_FI_DEV_GPU_TEMP").size(), 8u);
  EXPECT_EQ(Series(metrics.body, "DCGM_FI_DEV_POWER_USAGE").size(), 8u);
  EXPECT_THAT(metrics.body,
              HasSubstr("\ngpufleet_agent_backend_info{Hostname=\"node-a\",backend=\"sim\","
                        "driver_version=\"sim-0.1.0\"} 1\n"));
  EXPECT_THAT(metrics.body, HasSubstr("\ngpufleet_agent_healthy{Hostname=\"node-a\"} 1\n"));
  EXPECT_THAT(metrics.body,
              HasSubstr("\ngpufleet_agent_gpus{Hostname=\"node-a\",state=\"healthy\"} 8\n"));
  for (const auto& [gpu, series] : Series(metrics.body, "gpufleet_gpu_healthy"))
    EXPECT_THAT(series[0].labels, HasSubstr(",reason=\"\"")) << gpu;
  EXPECT_TRUE(Series(metrics.body, "gpufleet_gpu_job").empty());

  Json health = GetJson("/healthz");
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["backend"], "sim");
  EXPECT_EQ(health["gpus"], 8);
  EXPECT_EQ(health["healthy_gpus"], 8);
}

TEST_F(AgentDaemonTest, InjectedFaultsMakeTheGpuUnhealthyWithTheReason) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  net::HttpClientResponse injected =
      Post("/v1/sim/faults", R"({"gpu": 3, "kind": "xid", "code": 79})");
  ASSERT_EQ(injected.status, 200) << injected.body;
  Json gpu = Json::parse(injected.body);
  EXPECT_EQ(gpu["index"], 3);
  EXPECT_EQ(gpu["healthy"], false);
  EXPECT_EQ(gpu["health_reasons"], Json::array({"XID 79: GPU has fallen off the bus"}));

  Json gpus = GetJson("/v1/gpus");
  ASSERT_EQ(gpus["gpus"].size(), 8u);
  EXPECT_EQ(gpus["backend"], "sim");
  EXPECT_EQ(gpus["gpus"][3]["healthy"], false);
  EXPECT_EQ(gpus["gpus"][3]["last_xid"], 79);
  EXPECT_EQ(gpus["gpus"][2]["healthy"], true);

  // An application XID is exported but leaves the GPU healthy.
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 4, "kind": "xid", "code": 13})").status, 200);
  // A double-bit ECC error and an over-temperature GPU are unhealthy too.
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 5, "kind": "ecc", "code": 1})").status, 200);
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 6, "kind": "temperature", "code": 95})").status, 200);
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 7, "kind": "lost"})").status, 200);

  const std::string metrics = Get("/metrics").body;
  auto healthy = Series(metrics, "gpufleet_gpu_healthy");
  EXPECT_EQ(healthy[3][0].value, 0);
  EXPECT_THAT(healthy[3][0].labels, HasSubstr("reason=\"XID 79: GPU has fallen off the bus\""));
  EXPECT_EQ(healthy[4][0].value, 1);
  EXPECT_EQ(Series(metrics, "DCGM_FI_DEV_XID_ERRORS")[4][0].value, 13);
  EXPECT_EQ(healthy[5][0].value, 0);
  EXPECT_THAT(healthy[5][0].labels, HasSubstr("uncorrectable (double-bit) ECC error"));
  EXPECT_EQ(healthy[6][0].value, 0);
  EXPECT_THAT(healthy[6][0].labels, HasSubstr("temperature 95 C is over the 90 C limit"));
  EXPECT_EQ(healthy[7][0].value, 0);
  EXPECT_THAT(healthy[7][0].labels, HasSubstr("GPU lost"));
  EXPECT_THAT(metrics,
              HasSubstr("\ngpufleet_agent_gpus{Hostname=\"node-a\",state=\"unhealthy\"} 4\n"));
  EXPECT_TRUE(LogContains("GPU 3 (" + core_->inventory().gpus[3].uuid +
                          ") is unhealthy: XID 79: GPU has fallen off the bus"));

  // A simulated reset returns the GPU to service, sticky XID verdict included.
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 3, "kind": "clear"})").status, 200);
  EXPECT_EQ(GetJson("/v1/gpus")["gpus"][3]["healthy"], true);
  EXPECT_EQ(Series(Get("/metrics").body, "gpufleet_gpu_healthy")[3][0].value, 1);

  // Precise errors for bad requests.
  auto error_of = [&](const std::string& body) {
    net::HttpClientResponse response = Post("/v1/sim/faults", body);
    return std::to_string(response.status) + " " + Json::parse(response.body).value("error", "");
  };
  EXPECT_EQ(error_of(R"({"gpu": 3, "kind": "melt"})"),
            "400 unknown fault kind 'melt' (known: xid, ecc, row_remap, lost, temperature, clear)");
  EXPECT_THAT(error_of(R"({"gpu": 12, "kind": "xid", "code": 79})"), HasSubstr("400 "));
  EXPECT_EQ(error_of(R"({"gpu": 1, "kind": "xid", "code": 79, "when": 3})"),
            "400 unknown field 'when' (known fields: code, gpu, kind)");
  EXPECT_THAT(error_of(R"({"gpu": 1,)"), HasSubstr("400 malformed JSON: "));
}

TEST_F(AgentDaemonTest, FaultInjectionIsRefusedWithRealGpus) {
  AgentOptions options = SimOptions();
  options.sim_gpus.clear();
  options.nvml_library = GPUFLEET_FAKE_NVML;  // an nvml backend, on the test fixture
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  EXPECT_EQ(core_->backend_name(), "nvml");
  net::HttpClientResponse refused =
      Post("/v1/sim/faults", R"({"gpu": 0, "kind": "xid", "code": 79})");
  EXPECT_EQ(refused.status, 409);
  EXPECT_THAT(refused.body, HasSubstr("fault injection needs simulated GPUs (--sim-gpus); this "
                                      "agent uses the nvml backend"));
  EXPECT_THAT(Get("/metrics").body, HasSubstr(",backend=\"nvml\","));
}

TEST_F(AgentDaemonTest, NvmlFailureIsAnErrorNeverASimulation) {
  AgentOptions options = SimOptions();
  options.sim_gpus.clear();
  options.nvml_library = (root_ / "no-such-libnvidia-ml.so.1").string();
  auto opened = AgentCore::Open(options);
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.error().message, HasSubstr("cannot load NVML"));
  EXPECT_THAT(opened.error().message, HasSubstr("--sim-gpus"));
}

// A share of GPU `index` running `argv`, as the control loop asks for one.
LaunchRequest Share(const std::string& id, JobId job, int32_t index, MilliGpu milli,
                    std::vector<std::string> argv) {
  LaunchRequest request;
  request.id = id;
  request.job_id = job;
  request.argv = std::move(argv);
  request.gpu_indices = std::vector<int32_t>{index};
  request.gpu_milli = milli;
  return request;
}

const std::vector<std::string> kSayMpsEnvironment = {
    "sh", "-c",
    "echo \"$CUDA_MPS_PIPE_DIRECTORY|$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|"
    "$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|$GPUFLEET_GPU_SHARING\""};

TEST_F(AgentDaemonTest, SharesOfSimulatedGpusHaveTheirLimitsRecordedAndExported) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  EXPECT_EQ(core_->gpu_sharing(), GpuSharingMode::kRecorded);
  EXPECT_EQ(GetJson("/healthz")["gpu_sharing"], "recorded");
  auto third = core_->Launch(Share("third", 31, 2, 333, {"sleep", "30"}));
  ASSERT_TRUE(third.ok()) << third.error().message;
  const WorkloadSpec& spec = third.value().spec;
  // A third of an H100-80GB (81,559 MiB): 34 % of its SMs (rounded up), 27,159 MiB.
  EXPECT_EQ(spec.gpu_sharing, "recorded");
  EXPECT_EQ(spec.gpu_compute_percent, 34);
  EXPECT_EQ(spec.gpu_memory_limit_mib, std::vector<MiB>{27159});
  EXPECT_EQ(spec.env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "34");
  EXPECT_EQ(spec.env.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=27159M");
  EXPECT_EQ(spec.env.count("CUDA_MPS_PIPE_DIRECTORY"), 0u);  // no daemon on simulated GPUs
  const Json shown = GetJson("/v1/workloads/third")["gpu_share"];
  EXPECT_EQ(shown, Json({{"milli", 333},
                         {"sharing", "recorded"},
                         {"compute_percent", 34},
                         {"memory_limit_mib", {27159}}}))
      << shown.dump();
  // A whole GPU has no share and no limits.
  auto whole = core_->Launch(Share("whole", 32, 3, 1000, {"sleep", "30"}));
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole.value().spec.env.count("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), 0u);
  EXPECT_FALSE(GetJson("/v1/workloads/whole").contains("gpu_share"));

  core_->SampleNow();
  const auto limits = Series(Get("/metrics").body, "gpufleet_gpu_share_limit");
  ASSERT_EQ(limits.size(), 1u);  // GPU 2 only
  ASSERT_EQ(limits.at(2).size(), 2u);
  EXPECT_THAT(limits.at(2)[0].labels,
              HasSubstr("job_id=\"31\",limit=\"compute_percent\",sharing=\"recorded\""));
  EXPECT_EQ(limits.at(2)[0].value, 34);
  EXPECT_THAT(limits.at(2)[1].labels, HasSubstr("limit=\"memory_mib\""));
  EXPECT_EQ(limits.at(2)[1].value, 27159);
}

TEST_F(AgentDaemonTest, SharesOfNvidiaGpusRunUnderTheAgentsOwnMpsDaemon) {
  // A stand-in for NVIDIA's control program, speaking its protocol: "-d" starts the daemon (a
  // control file here), a command on stdin fails unless the daemon runs. Its calls are logged.
  const fs::path control = root_ / "nvidia-cuda-mps-control";
  const fs::path calls = root_ / "mps-calls";
  {
    std::ofstream script(control);
    script << "#!/bin/sh\n"
           << "if [ \"$1\" = -d ]; then\n"
           << "  echo \"start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY\" >> " << calls
           << "\n"
           << "  touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0\n"
           << "fi\n"
           << "read command\n"
           << "[ -e \"$CUDA_MPS_PIPE_DIRECTORY/control\" ] || exit 1\n"
           << "echo \"$command\" >> " << calls << "\n";
  }
  fs::permissions(control, fs::perms::owner_all);
  AgentOptions options = SimOptions();
  options.sim_gpus.clear();
  options.nvml_library = GPUFLEET_FAKE_NVML;
  options.mps_control = control.string();
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  ASSERT_EQ(core_->gpu_sharing(), GpuSharingMode::kMps);

  ASSERT_TRUE(core_->Launch(Share("half", 41, 0, 500, kSayMpsEnvironment)).ok());
  ASSERT_TRUE(core_->Launch(Share("quarter", 42, 0, 250, kSayMpsEnvironment)).ok());
  WaitFinished("half");
  WaitFinished("quarter");
  const std::string pipe = core_->data_dir() + "/mps/pipe";
  EXPECT_EQ(core_->Logs("half", "stdout", std::nullopt).value(), pipe + "|50|0=40779M|mps\n");
  EXPECT_EQ(core_->Logs("quarter", "stdout", std::nullopt).value(), pipe + "|25|0=20389M|mps\n");
  // One daemon for the node, started by the first share and found running by the second.
  std::ifstream logged(calls);
  std::vector<std::string> lines;
  for (std::string line; std::getline(logged, line);)
    lines.push_back(line);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(std::count(lines.begin(), lines.end(),
                       "start " + pipe + " " + core_->data_dir() + "/mps/log"),
            1)
      << ::testing::PrintToString(lines);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "get_server_list"),
            static_cast<long>(lines.size()) - 1);
}

TEST_F(AgentDaemonTest, AWorkloadGetsItsOwnMountNamespaceWithOtherGpusHiddenAndAPrivateTmp) {
  AgentOptions options = SimOptions();
  options.sim_gpus.clear();
  options.nvml_library = GPUFLEET_FAKE_NVML;  // GPU i is /dev/nvidia((i + 1) mod 5)
  options.workload_isolation = WorkloadIsolationMode::kNamespace;
  if (::geteuid() != 0) {
    auto refused = AgentCore::Open(options);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(refused.error().message,
                HasSubstr("--workload-isolation namespace needs the agent to run as root"));
    return;
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  EXPECT_TRUE(core_->mount_namespaces());
  EXPECT_THAT(GetJson("/healthz")["workload_isolation"].get<std::string>(),
              HasSubstr("other GPUs' device files hidden"));

  // A checkpoint directory under /tmp, as the control loop hands one: kept where it is named.
  const fs::path checkpoint = root_ / "checkpoint";
  fs::create_directories(checkpoint);
  const fs::path outside = root_ / "outside-file";
  std::ofstream(outside) << "the node's /tmp\n";
  LaunchRequest request;
  request.id = "fenced";
  request.job_id = 51;
  request.gpu_indices = std::vector<int32_t>{2, 4};
  request.env = {{"GPUFLEET_CHECKPOINT_DIR", checkpoint.string()}};
  request.argv = {
      "sh", "-c",
      fmt::format("echo private > /tmp/mine; echo saved > {}/state; touch /dev/shm/segment; "
                  "cat {} 2>/dev/null || echo unseen; cat $TMPDIR/mine; pwd",
                  checkpoint.string(), outside.string())};
  auto launched = core_->Launch(request);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  EXPECT_EQ(launched.value().spec.isolation.hidden_devices,
            (std::vector<std::string>{"/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia4"}));
  EXPECT_EQ(launched.value().spec.isolation.keep_visible,
            (std::vector<std::string>{checkpoint.string()}));
  const Json finished = WaitFinished("fenced");
  EXPECT_EQ(finished.value("exit_code", -1), 0) << finished.dump();
  EXPECT_EQ(finished["isolation"]["hidden_devices"].size(), 3u);
  const std::string workdir = core_->data_dir() + "/workloads/fenced/work";
  // Its /tmp is its TMPDIR; the node's /tmp (the test's file) is out of sight, its own
  // directories and the checkpoint are where they were.
  EXPECT_EQ(core_->Logs("fenced", "stdout", std::nullopt).value(),
            "unseen\nprivate\n" + workdir + "\n");
  EXPECT_FALSE(fs::exists("/tmp/mine"));
  EXPECT_TRUE(fs::exists(core_->data_dir() + "/workloads/fenced/tmp/mine"));
  EXPECT_TRUE(fs::exists(checkpoint / "state"));
  EXPECT_FALSE(fs::exists("/dev/shm/segment"));
}

TEST_F(AgentDaemonTest, WithoutMpsSharesAreAdvisoryAndSaySoOrMpsIsAStartError) {
  AgentOptions options = SimOptions();
  options.sim_gpus.clear();
  options.nvml_library = GPUFLEET_FAKE_NVML;
  options.mps_control = (root_ / "no-such-mps-control").string();
  options.gpu_sharing = GpuSharingMode::kMps;
  auto refused = AgentCore::Open(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message,
              HasSubstr("--gpu-sharing mps: " + options.mps_control + " not found"));

  options.gpu_sharing = GpuSharingMode::kAuto;
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  EXPECT_EQ(core_->gpu_sharing(), GpuSharingMode::kAdvisory);
  EXPECT_THAT(::testing::PrintToString(core_->startup_notes()),
              HasSubstr("GPU shares are advisory"));
  ASSERT_TRUE(core_->Launch(Share("told", 51, 0, 500, kSayMpsEnvironment)).ok());
  WaitFinished("told");
  EXPECT_EQ(core_->Logs("told", "stdout", std::nullopt).value(), "|||advisory\n");
}

TEST_F(AgentDaemonTest, LaunchHoldsGpusShowsJobsAndLoadsTheSimulatedGpus) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  net::HttpClientResponse launched =
      Post("/v1/workloads", R"({"argv": ["sleep", "30"], "gpus": 2, "job_id": 77, "grace": 1})");
  ASSERT_EQ(launched.status, 201) << launched.body;
  Json workload = Json::parse(launched.body);
  const std::string id = workload["id"];
  EXPECT_EQ(workload["state"], "running");
  EXPECT_EQ(workload["gpus"], Json::array({0, 1}));
  EXPECT_EQ(workload["gpu_uuids"][1], core_->inventory().gpus[1].uuid);
  EXPECT_EQ(workload["grace_ms"], 1000);
  EXPECT_EQ(launched.Header("Location"), "/v1/workloads/" + id);

  core_->SampleNow();  // the next sample
  const std::string metrics = Get("/metrics").body;
  auto jobs = Series(metrics, "gpufleet_gpu_job");
  ASSERT_EQ(jobs.size(), 2u) << metrics;
  EXPECT_THAT(jobs[0][0].labels, HasSubstr(",job_id=\"77\""));
  EXPECT_THAT(jobs[1][0].labels, HasSubstr(",job_id=\"77\""));
  auto utilization = Series(metrics, "DCGM_FI_DEV_GPU_UTIL");
  EXPECT_GE(utilization[0][0].value, 95);
  EXPECT_GE(utilization[1][0].value, 95);
  for (int gpu = 2; gpu < 8; ++gpu)
    EXPECT_EQ(utilization[gpu][0].value, 0) << gpu;
  EXPECT_GT(Series(metrics, "DCGM_FI_DEV_POWER_USAGE")[0][0].value, 600);
  Json gpus = GetJson("/v1/gpus");
  EXPECT_EQ(gpus["gpus"][0]["workloads"], Json::array({id}));
  EXPECT_EQ(gpus["gpus"][0]["sample"]["process_ids"], Json::array({workload["pid"]}));

  // Precise errors.
  auto error_of = [&](const std::string& body) {
    net::HttpClientResponse response = Post("/v1/workloads", body);
    return std::to_string(response.status) + " " + Json::parse(response.body).value("error", "");
  };
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpus": [1]})"),
            "409 GPU 1 is in use by workload " + id);
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpus": [8]})"),
            "400 no GPU with index 8 on this node (it has 0,1,2,3,4,5,6,7)");
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpus": [2, 2]})"), "400 GPU 2 is listed twice");
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpus": 9})"), "400 asked for 9 GPUs; this node has 8");
  EXPECT_THAT(error_of(R"({"argv": ["true"], "gpus": 7})"),
              HasSubstr("409 asked for 7 GPUs but only 6 of 8 are free and healthy"));
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpu": 1})"),
            "400 unknown field 'gpu' (known fields: argv, cpu, env, gpus, grace, id, job_id, "
            "max_runtime, memory, task_index, workdir)");
  EXPECT_THAT(error_of(R"({"argv": ["true"], )"), HasSubstr("400 malformed JSON: "));
  EXPECT_EQ(error_of(R"([1, 2])"), "400 expected a JSON object, got array");
  EXPECT_EQ(error_of(R"({"gpus": 1})"), "400 'argv' is required: the command to run");
  EXPECT_EQ(error_of(R"({"argv": [1]})"), "400 'argv' must be a non-empty array of strings");
  EXPECT_THAT(error_of(R"({"argv": ["true"], "gpus": 1.5})"), HasSubstr("400 'gpus' must be"));
  EXPECT_THAT(error_of(R"({"argv": ["true"], "memory": "lots"})"), HasSubstr("400 'memory' must"));
  EXPECT_EQ(error_of(R"({"argv": ["true"], "id": "../x"})"),
            "400 invalid workload spec: workload id '../x' may only use A-Z a-z 0-9 _ - . and may "
            "not start with '.'");
  ASSERT_EQ(Post("/v1/sim/faults", R"({"gpu": 2, "kind": "ecc", "code": 1})").status, 200);
  EXPECT_EQ(error_of(R"({"argv": ["true"], "gpus": [2]})"),
            "409 GPU 2 is unhealthy: 1 uncorrectable (double-bit) ECC error");

  // The agent picks around busy and unhealthy GPUs.
  net::HttpClientResponse second = Post("/v1/workloads", R"({"argv": ["sleep", "30"], "gpus": 3})");
  ASSERT_EQ(second.status, 201) << second.body;
  EXPECT_EQ(Json::parse(second.body)["gpus"], Json::array({3, 4, 5}));

  // Cancel: SIGTERM, and the GPUs are free again.
  net::HttpClientResponse cancelled = Post("/v1/workloads/" + id + "/cancel", "");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  Json finished = WaitFinished(id);
  EXPECT_EQ(finished["state"], "exited");
  EXPECT_EQ(finished["cancelled"], true);
  EXPECT_EQ(finished["signal"], 15);
  EXPECT_EQ(finished["signal_name"], "SIGTERM");
  core_->SampleNow();
  auto after = Series(Get("/metrics").body, "gpufleet_gpu_job");
  EXPECT_EQ(after.count(0), 0u);
  EXPECT_EQ(after.count(3), 1u);
  EXPECT_EQ(Series(Get("/metrics").body, "DCGM_FI_DEV_GPU_UTIL")[0][0].value, 0);
  EXPECT_TRUE(
      LogContains("workload " + id + " was killed by SIGTERM (cancelled); GPUs 0,1 are free"));
  EXPECT_EQ(Post("/v1/workloads/nope/cancel", "").status, 404);
  EXPECT_EQ(Post("/v1/workloads/" + id + "/cancel", R"({"grace": "soon"})").status, 400);
  EXPECT_EQ(Get("/v1/workloads/nope").status, 404);
}

TEST_F(AgentDaemonTest, LogsListAndEnvironment) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  net::HttpClientResponse launched = Post("/v1/workloads", R"({
      "id": "printer", "argv": ["sh", "-c",
        "for i in 1 2 3 4 5; do echo line$i; done; echo gpus=$CUDA_VISIBLE_DEVICES job=$GPUFLEET_JOB_ID mine=$MINE; echo oops >&2; exit 4"],
      "env": {"MINE": "yes"}, "gpus": [6, 2], "cpu": "250m", "memory": "1Gi"})");
  ASSERT_EQ(launched.status, 201) << launched.body;
  Json workload = Json::parse(launched.body);
  EXPECT_EQ(workload["cpu_milli"], 250);
  EXPECT_EQ(workload["memory_mib"], 1024);
  Json finished = WaitFinished("printer");
  EXPECT_EQ(finished["exit_code"], 4);
  EXPECT_EQ(finished["signal"], nullptr);

  EXPECT_EQ(Get("/v1/workloads/printer/logs").body,
            "line1\nline2\nline3\nline4\nline5\ngpus=6,2 job=0 mine=yes\n");
  EXPECT_EQ(Get("/v1/workloads/printer/logs?tail=2").body, "line5\ngpus=6,2 job=0 mine=yes\n");
  EXPECT_EQ(Get("/v1/workloads/printer/logs?tail=0").body, "");
  EXPECT_EQ(Get("/v1/workloads/printer/logs?stream=stderr").body, "oops\n");
  EXPECT_EQ(Get("/v1/workloads/printer/logs?stream=both").status, 400);
  EXPECT_EQ(Get("/v1/workloads/printer/logs?tail=-1").status, 400);
  EXPECT_EQ(Get("/v1/workloads/ghost/logs").status, 404);

  Json list = GetJson("/v1/workloads");
  ASSERT_EQ(list["workloads"].size(), 1u);
  EXPECT_EQ(list["workloads"][0]["id"], "printer");
  EXPECT_EQ(list["workloads"][0]["gpus"], Json::array({6, 2}));
  EXPECT_EQ(Post("/v1/workloads", R"({"id": "printer", "argv": ["true"]})").status, 409);
}

TEST_F(AgentDaemonTest, LogsByOffsetCountEveryByteAcrossRotation) {
  AgentOptions options = SimOptions();
  options.workload_logs = {1000, 2};
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  ASSERT_EQ(Post("/v1/workloads", R"({"id": "rotating", "argv": ["sh", "-c",
      "i=0; while [ $i -lt 500 ]; do printf 'line %013d\\n' $i; i=$((i+1)); done"]})")
                .status,
            201);
  ASSERT_EQ(WaitFinished("rotating")["exit_code"], 0);
  std::string all;
  for (int line = 0; line < 500; ++line)
    all += fmt::format("line {:013}\n", line);
  const std::string size = std::to_string(all.size());

  // 19-byte lines, rotated every 1000 bytes (52 lines), two rotated files kept: the live file
  // and those hold the lines from 364 on; the 364 before are gone.
  net::HttpClientResponse from_start = Get("/v1/workloads/rotating/logs?offset=0");
  ASSERT_EQ(from_start.status, 200);
  EXPECT_EQ(from_start.Header("X-Log-Skipped"), std::to_string(364 * 19));
  EXPECT_EQ(from_start.body, all.substr(364 * 19));
  EXPECT_EQ(from_start.Header("X-Log-Next-Offset"), size);
  EXPECT_EQ(from_start.Header("X-Log-Finished"), "true");

  // Any offset still kept reads exactly those bytes, whichever file they are in.
  for (size_t offset : {size_t{364 * 19}, size_t{7000}, all.size() - 1000, all.size() - 7}) {
    net::HttpClientResponse part =
        Get("/v1/workloads/rotating/logs?offset=" + std::to_string(offset));
    EXPECT_EQ(part.body, all.substr(offset)) << offset;
    EXPECT_EQ(part.Header("X-Log-Skipped"), "") << offset;
    EXPECT_EQ(part.Header("X-Log-Next-Offset"), size);
  }
  net::HttpClientResponse past = Get("/v1/workloads/rotating/logs?offset=20000");
  EXPECT_EQ(past.body, "");
  EXPECT_EQ(past.Header("X-Log-Next-Offset"), "20000");
  EXPECT_EQ(past.Header("X-Log-Finished"), "true");
  net::HttpClientResponse errors = Get("/v1/workloads/rotating/logs?offset=0&stream=stderr");
  EXPECT_EQ(errors.body, "");
  EXPECT_EQ(errors.Header("X-Log-Next-Offset"), "0");
  EXPECT_EQ(errors.Header("X-Log-Finished"), "true");
  // Without an offset: the tail as before.
  EXPECT_EQ(Get("/v1/workloads/rotating/logs?tail=1").body, "line 0000000000499\n");

  EXPECT_EQ(Get("/v1/workloads/rotating/logs?offset=-1").status, 400);
  EXPECT_EQ(Get("/v1/workloads/rotating/logs?offset=ten").status, 400);
  EXPECT_EQ(Get("/v1/workloads/rotating/logs?offset=0&tail=3").status, 400);
  EXPECT_EQ(Get("/v1/workloads/ghost/logs?offset=0").status, 404);
}

TEST_F(AgentDaemonTest, LogsByOffsetFollowARunningWorkloadInChunksOfAtMostOneMebibyte) {
  AgentOptions options = SimOptions();
  options.workload_logs.max_line_bytes = 0;  // one 1.5 MiB line, as written
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  const std::string go = (root_ / "go").string();
  Json body = {{"id", "follower"},
               {"argv",
                {"sh", "-c",
                 "echo first; while [ ! -e '" + go +
                     "' ]; do sleep 0.02; done; head -c 1572864 /dev/zero | tr '\\0' x"}}};
  ASSERT_EQ(Post("/v1/workloads", body.dump()).status, 201);
  net::HttpClientResponse first;
  ASSERT_TRUE(WaitUntil(
      [&] {
        first = Get("/v1/workloads/follower/logs?offset=0");
        return first.body == "first\n";
      },
      10s));
  EXPECT_EQ(first.Header("X-Log-Next-Offset"), "6");
  EXPECT_EQ(first.Header("X-Log-Finished"), "false");  // it runs: more may come

  executor_testing::WriteText(go, "");
  ASSERT_EQ(WaitFinished("follower")["exit_code"], 0);
  net::HttpClientResponse chunk = Get("/v1/workloads/follower/logs?offset=6");
  EXPECT_EQ(chunk.body, std::string(size_t{1} << 20, 'x'));
  EXPECT_EQ(chunk.Header("X-Log-Next-Offset"), std::to_string(6 + (1 << 20)));
  EXPECT_EQ(chunk.Header("X-Log-Finished"), "false");  // ended, but not all read yet
  net::HttpClientResponse rest =
      Get("/v1/workloads/follower/logs?offset=" + chunk.Header("X-Log-Next-Offset"));
  EXPECT_EQ(rest.body, std::string(size_t{512} << 10, 'x'));
  EXPECT_EQ(rest.Header("X-Log-Next-Offset"), std::to_string(6 + 1572864));
  EXPECT_EQ(rest.Header("X-Log-Finished"), "true");
}

TEST_F(AgentDaemonTest, ARestartedAgentReadoptsRunningWorkloadsAndTheirGpus) {
  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  net::HttpClientResponse launched =
      Post("/v1/workloads", R"({"id": "survivor", "argv": ["sleep", "30"], "gpus": 2})");
  ASSERT_EQ(launched.status, 201) << launched.body;
  const int pid = Json::parse(launched.body)["pid"];
  StopAgent();  // the workload keeps running under its shim
  EXPECT_EQ(::kill(pid, 0), 0);

  ASSERT_NO_FATAL_FAILURE(StartAgent(SimOptions()));
  ASSERT_EQ(core_->adopted().size(), 1u);
  EXPECT_THAT(core_->startup_notes(),
              testing::Contains("re-adopted workload survivor (running, pid " +
                                std::to_string(pid) + ") on GPUs 0,1"));
  Json workload = GetJson("/v1/workloads/survivor");
  EXPECT_EQ(workload["state"], "running");
  EXPECT_EQ(workload["adopted"], true);
  auto jobs = Series(Get("/metrics").body, "gpufleet_gpu_job");
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_THAT(jobs[1][0].labels, HasSubstr(",job_id=\"survivor\""));
  // Its GPUs are still taken.
  EXPECT_EQ(Post("/v1/workloads", R"({"argv": ["true"], "gpus": [0]})").status, 409);
  net::HttpClientResponse next = Post("/v1/workloads", R"({"argv": ["true"], "gpus": 1})");
  EXPECT_EQ(Json::parse(next.body)["gpus"], Json::array({2}));
}

TEST_F(AgentDaemonTest, TheSamplingThreadSamplesAtTheIntervalAndAfterALaunch) {
  AgentOptions options = SimOptions();
  options.start_sampler = true;
  options.sample_interval_ms = 3'600'000;  // no regular tick during the test
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  ASSERT_EQ(Post("/v1/workloads", R"({"argv": ["sleep", "30"], "gpus": 1})").status, 201);
  // The launch wakes the sampler: the holder shows up without waiting for a tick.
  EXPECT_TRUE(
      WaitUntil([&] { return Series(Get("/metrics").body, "gpufleet_gpu_job").size() == 1; }, 5s));
  StopAgent();

  options.sample_interval_ms = 20;
  ASSERT_NO_FATAL_FAILURE(StartAgent(options));
  const std::string first = Get("/metrics").body;
  EXPECT_TRUE(WaitUntil(
      [&] {
        return Series(Get("/metrics").body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[0][0].value >
               Series(first, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[0][0].value;
      },
      5s));
  EXPECT_TRUE(core_->SamplerHealthy());
}

TEST(GpuShareLimits, ComputeRoundsUpMemoryRoundsDownPerGpu) {
  EXPECT_EQ(ShareLimits(1, {81559}).compute_percent, 1);  // never 0: that would be no limit
  EXPECT_EQ(ShareLimits(1, {81559}).memory_limit_mib, std::vector<MiB>{81});
  EXPECT_EQ(ShareLimits(999, {81559}).compute_percent, 100);
  const GpuShareLimits half = ShareLimits(500, {81559, 46068});
  EXPECT_EQ(half.compute_percent, 50);
  EXPECT_EQ(half.memory_limit_mib, (std::vector<MiB>{40779, 23034}));
  EXPECT_EQ(PinnedMemoryLimitValue(half.memory_limit_mib), "0=40779M,1=23034M");
  EXPECT_EQ(ParseGpuSharingMode("mps"), GpuSharingMode::kMps);
  EXPECT_EQ(ParseGpuSharingMode("MPS"), std::nullopt);
}

TEST(AgentQuantities, Parse) {
  EXPECT_EQ(ParseMemoryMib("512Mi"), 512);
  EXPECT_EQ(ParseMemoryMib("2Gi"), 2048);
  EXPECT_EQ(ParseMemoryMib("1.5Gi"), 1536);
  EXPECT_EQ(ParseMemoryMib("64"), 64);
  EXPECT_EQ(ParseMemoryMib("100Ki"), 1);
  EXPECT_EQ(ParseMemoryMib("lots"), std::nullopt);
  EXPECT_EQ(ParseMemoryMib("-1Gi"), std::nullopt);
  EXPECT_EQ(ParseMemoryMib("2GB"), std::nullopt);
  EXPECT_EQ(ParseCpuMilli("0.5"), 500);
  EXPECT_EQ(ParseCpuMilli("500m"), 500);
  EXPECT_EQ(ParseCpuMilli("2"), 2000);
  EXPECT_EQ(ParseCpuMilli("2 cores"), std::nullopt);
  EXPECT_EQ(ParseDurationMs("30s"), 30000);
  EXPECT_EQ(ParseDurationMs("500ms"), 500);
  EXPECT_EQ(ParseDurationMs("1.5s"), 1500);
  EXPECT_EQ(ParseDurationMs("2m"), 120000);
  EXPECT_EQ(ParseDurationMs("1h"), 3600000);
  EXPECT_EQ(ParseDurationMs("10"), 10000);
  EXPECT_EQ(ParseDurationMs("soon"), std::nullopt);
  EXPECT_EQ(SignalName(15), "SIGTERM");
  EXPECT_EQ(SignalName(9), "SIGKILL");

  std::string error;
  auto address = ParseListenAddress("127.0.0.1:9400", error);
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_EQ(address->port, 9400);
  address = ParseListenAddress(":0", error);
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_EQ(address->port, 0);
  address = ParseListenAddress("localhost:80", error);
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_FALSE(ParseListenAddress("127.0.0.1:http", error));
  EXPECT_EQ(error, "--listen '127.0.0.1:http': expected HOST:PORT such as 127.0.0.1:9400");
}

}  // namespace
}  // namespace gpufleet::agent
