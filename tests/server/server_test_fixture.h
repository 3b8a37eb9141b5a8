#pragma once

// The fixture of the control plane's API tests: a real Server on a loopback port with a temporary
// data dir. Agents are played by the tests (plain calls to /api/v1/agents/sync), and so is an
// agent's logs endpoint (a small HttpServer). Nothing is timed: waits poll a condition up to a
// generous deadline, and a long poll that is not woken would outlast the client's timeout.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "api/json.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "server/server.h"
#include "store/sqlite_store.h"

namespace gpufleet::server::test_support {

using namespace std::chrono_literals;
using api::JobRecord;
using api::JobState;
using nlohmann::json;

constexpr auto kDeadline = 15s;

struct Reply {
  int status = 0;
  std::string body;
  net::HttpClientResponse raw;
  json Json() const { return json::parse(body); }
};

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-server-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Polls `done` until it holds or the deadline passes.
inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds deadline = kDeadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

inline api::NodeReport NodeReport(const std::string& name, int gpus = 4,
                                  const std::string& agent_url = "") {
  api::NodeReport report;
  report.name = name;
  report.address = "10.0.0." + name.substr(name.size() - 1);
  report.agent_url = agent_url.empty() ? "http://127.0.0.1:1" : agent_url;
  report.backend = "sim";
  report.cpu_milli = 64000;
  report.memory_mib = 512 * 1024;
  for (int i = 0; i < gpus; ++i) {
    api::GpuStatus gpu;
    gpu.index = i;
    gpu.uuid = fmt::format("GPU-{}-{}", name, i);
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81559;
    report.gpus.push_back(gpu);
  }
  return report;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { server_.reset(); }

  void Start() {
    ServerOptions options = options_;
    options.data_dir = dir_.path();
    options.port = 0;
    auto opened = Server::Open(options);
    ASSERT_TRUE(opened.server) << opened.error;
    server_ = std::move(opened.server);
    if (admin_.empty()) {
      auto created = server_->CreateToken("root", "ops", api::Role::kAdmin, "test");
      ASSERT_TRUE(created.token) << created.error;
      admin_ = created.token->secret;
      agent_ = Token("agent", "", "agent");
      alice_ = Token("alice", "vision", "user");
      bob_ = Token("bob", "speech", "user");
    }
  }

  void Restart() {
    server_.reset();
    Start();
  }

  Reply Call(const std::string& method, const std::string& path, const std::string& token,
             const std::string& body = "", std::chrono::milliseconds timeout = 10s) {
    net::HttpCallOptions call;
    call.body = body;
    call.timeout = timeout;
    if (!token.empty()) call.headers.emplace_back("Authorization", "Bearer " + token);
    net::HttpResult result = net::HttpCall(method, server_->url() + path, call);
    Reply reply;
    EXPECT_TRUE(result.ok()) << method << " " << path << ": " << result.error;
    if (!result.ok()) return reply;
    reply.status = result.response->status;
    reply.body = result.response->body;
    reply.raw = *result.response;
    return reply;
  }

  std::string Token(const std::string& user, const std::string& team, const std::string& role) {
    const Reply reply = Call("POST", "/api/v1/tokens", admin_,
                             json{{"user", user}, {"team", team}, {"role", role}}.dump());
    EXPECT_EQ(reply.status, 201) << reply.body;
    return reply.status == 201 ? reply.Json().at("token").get<std::string>() : "";
  }

  JobId Submit(const std::string& token, const json& job) {
    const Reply reply = Call("POST", "/api/v1/jobs", token, job.dump());
    EXPECT_EQ(reply.status, 201) << reply.body;
    return reply.status == 201 ? reply.Json().at("id").get<JobId>() : 0;
  }

  JobRecord Job(JobId id, const std::string& token = "") {
    const Reply reply =
        Call("GET", fmt::format("/api/v1/jobs/{}", id), token.empty() ? admin_ : token);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200 ? reply.Json().get<JobRecord>() : JobRecord{};
  }

  bool WaitForState(JobId id, JobState state) {
    return WaitUntil([&] { return Job(id).state == state; });
  }

  api::SyncResponse Sync(const api::NodeReport& node,
                         std::vector<api::WorkloadReport> workloads = {},
                         uint64_t known_version = 0, int32_t wait_ms = 0,
                         std::chrono::milliseconds timeout = 10s) {
    api::SyncRequest request;
    request.node = node;
    request.workloads = std::move(workloads);
    request.known_version = known_version;
    request.wait_ms = wait_ms;
    request.agent_key = agent_key_;
    const Reply reply = Call("POST", "/api/v1/agents/sync", agent_, json(request).dump(), timeout);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200 ? reply.Json().get<api::SyncResponse>() : api::SyncResponse{};
  }

  static const api::TaskLaunch* Find(const api::SyncResponse& response, JobId job) {
    for (const api::TaskLaunch& launch : response.desired)
      if (launch.job_id == job) return &launch;
    return nullptr;
  }

  static api::WorkloadReport Report(const api::TaskLaunch& launch, std::string state,
                                    std::optional<int32_t> exit_code = std::nullopt) {
    api::WorkloadReport report;
    report.workload_id = launch.workload_id;
    report.job_id = launch.job_id;
    report.rank = launch.rank;
    report.attempt = launch.attempt;
    report.state = std::move(state);
    report.exit_code = exit_code;
    return report;
  }

  size_t JobCount() {
    const Reply reply = Call("GET", "/api/v1/jobs?limit=10000", admin_);
    return reply.Json().at("jobs").size();
  }

  std::vector<std::string> AuditActions() {
    const Reply reply = Call("GET", "/api/v1/audit", admin_);
    EXPECT_EQ(reply.status, 200) << reply.body;
    std::vector<std::string> actions;
    const json entries = reply.Json().at("entries");
    for (const json& entry : entries)
      actions.push_back(entry.at("action").get<std::string>() + " " +
                        entry.at("target").get<std::string>());
    return actions;
  }

  TempDir dir_;
  ServerOptions options_ = [] {
    ServerOptions options;
    options.schedule_interval_ms = 200;
    options.heartbeat_ms = 60000;  // a long poll that is not woken outlasts the test's timeout
    options.token_rate_limit = 0;  // WaitUntil polls faster than people; RateLimit tests it
    return options;
  }();
  std::unique_ptr<Server> server_;
  std::string admin_, agent_, alice_, bob_;
  std::string agent_key_;  // what Sync tells the server the agent's API wants
};

}  // namespace gpufleet::server::test_support
