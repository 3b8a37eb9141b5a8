#include "agent/fleet.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "agent/control_loop.h"
#include "api/json.h"
#include "api/types.h"
#include "core/version.h"
#include "net/http_client.h"
#include "net/server_urls.h"

namespace gpufleet::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr TimeMs kMaxSleepMs = 30LL * 24 * 3600 * 1000;

TimeMs WallMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string DottedQuad(uint32_t address) {
  return fmt::format("{}.{}.{}.{}", address >> 24, (address >> 16) & 255, (address >> 8) & 255,
                     address & 255);
}

// How long `sleep SECONDS` sleeps, or why the fleet cannot run the command.
std::optional<TimeMs> SleepMs(const std::vector<std::string>& argv, std::string& error) {
  if (argv.size() == 2 &&
      (argv[0] == "sleep" || argv[0] == "/bin/sleep" || argv[0] == "/usr/bin/sleep")) {
    try {
      size_t used = 0;
      const double seconds = std::stod(argv[1], &used);
      if (used == argv[1].size() && std::isfinite(seconds) && seconds >= 0)
        return std::min<TimeMs>(static_cast<TimeMs>(seconds * 1000), kMaxSleepMs);
    } catch (const std::exception&) {
    }
  }
  error = fmt::format("the fleet simulator runs only `sleep SECONDS` (docs/scale.md), not `{}`",
                      fmt::join(argv, " "));
  return std::nullopt;
}

struct Task {
  api::WorkloadReport report;
  std::vector<int32_t> gpus;
  bool end_reported = false;  // a sync that carried its end was answered
};

}  // namespace

struct Fleet::State : std::enable_shared_from_this<Fleet::State> {
  struct Node {
    std::mutex mu;
    int32_t index = 0;
    api::NodeReport report;  // the fixed part; GPU utilization is filled in per sync
    uint64_t known_version = 0;
    std::map<std::string, Task> tasks;  // by workload id
    bool synced = false;
    bool report_in_flight = false;
    bool report_again = false;
    TimeMs backoff_ms = kSyncFirstBackoffMs;
    size_t server = 0;  // which of the servers it syncs with now
  };

  explicit State(FleetOptions fleet_options) : options(std::move(fleet_options)) {}

  FleetOptions options;
  std::vector<std::string> servers;
  std::unique_ptr<net::AsyncHttpClient> client;
  std::vector<std::unique_ptr<Node>> nodes;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> nodes_synced{0}, syncs{0}, sync_errors{0}, tasks_running{0}, launches{0},
      refused{0}, finished{0}, cancelled{0};
  std::mutex log_mu;
  std::set<std::string> logged;  // each kind of error once

  void Log(const std::string& message) {
    {
      std::lock_guard lock(log_mu);
      if (logged.size() > 100 || !logged.insert(message).second) return;
    }
    if (options.log)
      options.log(message);
    else
      LogToStderr(message);
  }

  std::string NodeName(int32_t index) const {
    return fmt::format("{}{:05}", options.name_prefix, index + 1);
  }
  std::string NodeAddress(int32_t index) const {
    return DottedQuad(options.first_address + static_cast<uint32_t>(index) + 1);
  }

  void MakeNodes() {
    for (int32_t i = 0; i < options.nodes; ++i) {
      auto node = std::make_unique<Node>();
      node->index = i;
      api::NodeReport& report = node->report;
      report.name = NodeName(i);
      report.address = NodeAddress(i);
      report.backend = "fleet";
      const int32_t rack = i / std::max(options.nodes_per_rack, 1);
      report.rack = fmt::format("rack-{}", rack);
      report.spine = fmt::format("spine-{}", rack / std::max(options.racks_per_spine, 1));
      report.agent_version = kVersion;
      report.cpu_milli = options.cpu_milli_per_node;
      report.memory_mib = options.memory_mib_per_node;
      for (int32_t g = 0; g < options.gpus_per_node; ++g) {
        api::GpuStatus gpu;
        gpu.index = g;
        gpu.uuid = fmt::format("GPU-f1ee7000-{:08x}-{:04x}", i, g);
        gpu.model = options.gpu_model;
        gpu.memory_mib = options.gpu_memory_mib;
        gpu.temperature_c = 35;
        gpu.power_w = 70;
        report.gpus.push_back(std::move(gpu));
      }
      nodes.push_back(std::move(node));
    }
  }

  // Under node.mu.
  std::string RequestBody(Node& node, int32_t wait_ms) {
    api::SyncRequest request;
    request.node = node.report;
    for (api::GpuStatus& gpu : request.node.gpus) {
      gpu.utilization_pct = 0;
      gpu.memory_used_mib = 0;
    }
    for (const auto& [id, task] : node.tasks) {
      request.workloads.push_back(task.report);
      if (task.report.state != "running") continue;
      for (int32_t index : task.gpus) {
        if (index < 0 || index >= static_cast<int32_t>(request.node.gpus.size())) continue;
        request.node.gpus[static_cast<size_t>(index)].utilization_pct = 100;
        request.node.gpus[static_cast<size_t>(index)].memory_used_mib = options.gpu_memory_mib / 2;
      }
    }
    request.known_version = node.known_version;
    request.wait_ms = wait_ms;
    return nlohmann::json(request).dump();
  }

  void Send(Node& node, const std::string& body, TimeMs wait_ms,
            std::function<void(std::optional<api::SyncResponse>)> done) {
    net::HttpCallOptions http;
    http.body = body;
    http.timeout = milliseconds(wait_ms + kSyncCallMarginMs);
    http.headers.emplace_back("Authorization", "Bearer " + options.token);
    http.local_address = node.report.address;
    const std::string url = servers[node.server] + std::string(kSyncPath);
    Node* target = &node;
    client->Call("POST", url, std::move(http),
                 [self = shared_from_this(), target, done = std::move(done)](
                     net::HttpResult result) { self->Answered(*target, std::move(result), done); });
  }

  void Answered(Node& node, net::HttpResult result,
                const std::function<void(std::optional<api::SyncResponse>)>& done) {
    if (stopping) return;
    std::string error;
    std::optional<api::SyncResponse> answer;
    if (!result.ok()) {
      error = result.error;
    } else if (result.response->status != 200) {
      error =
          fmt::format("HTTP {}: {}", result.response->status, result.response->body.substr(0, 200));
    } else {
      try {
        answer = nlohmann::json::parse(result.response->body).get<api::SyncResponse>();
      } catch (const nlohmann::json::exception& parse_error) {
        error = fmt::format("an answer that is not a sync: {}", parse_error.what());
      }
    }
    {
      std::lock_guard lock(node.mu);
      if (answer) {
        ++syncs;
        node.backoff_ms = kSyncFirstBackoffMs;
        if (!node.synced) ++nodes_synced;
        node.synced = true;
      } else {
        ++sync_errors;
        if (node.synced) --nodes_synced;
        node.synced = false;
        // A server that cannot be reached, or a standby (its redirect, or a 503), may not be
        // the leader: try the next one. The fleet is given every server, so it does not follow
        // redirects.
        if (!result.ok() || result.response->status == 503 ||
            net::AnotherServerShouldAnswer(result))
          node.server = (node.server + 1) % servers.size();
      }
    }
    if (!answer) Log(fmt::format("fleet: a sync failed: {}", error));
    done(std::move(answer));
  }

  void LongPoll(Node& node) {
    if (stopping) return;
    std::string body;
    {
      std::lock_guard lock(node.mu);
      body = RequestBody(node, static_cast<int32_t>(options.wait_ms));
    }
    const Clock::time_point sent = Clock::now();
    Send(node, body, options.wait_ms, [this, &node, sent](std::optional<api::SyncResponse> answer) {
      if (!answer) {
        TimeMs backoff = 0;
        {
          std::lock_guard lock(node.mu);
          backoff = node.backoff_ms;
          node.backoff_ms = std::min(node.backoff_ms * 2, kSyncMaxBackoffMs);
        }
        return After(backoff, [this, &node] { LongPoll(node); });
      }
      bool unchanged = false;
      {
        std::lock_guard lock(node.mu);
        unchanged = answer->version == node.known_version;
      }
      Apply(node, *answer);
      const TimeMs took = std::chrono::duration_cast<milliseconds>(Clock::now() - sent).count();
      if (unchanged && took < kQuickAnswerMs)
        After(kQuickAnswerPauseMs, [this, &node] { LongPoll(node); });
      else
        LongPoll(node);
    });
  }

  // A short sync that tells the server of ends now rather than at the next long poll's return.
  void Report(Node& node) {
    if (stopping) return;
    std::string body;
    std::set<std::string> ends;
    {
      std::lock_guard lock(node.mu);
      if (node.report_in_flight) {
        node.report_again = true;
        return;
      }
      node.report_in_flight = true;
      node.report_again = false;
      body = RequestBody(node, 0);
      for (const auto& [id, task] : node.tasks)
        if (task.report.state != "running") ends.insert(id);
    }
    Send(node, body, 0, [this, &node, ends](std::optional<api::SyncResponse> answer) {
      bool again = false;
      TimeMs backoff = 0;
      {
        std::lock_guard lock(node.mu);
        node.report_in_flight = false;
        again = node.report_again || !answer;
        if (answer) {
          for (const std::string& id : ends)
            if (auto it = node.tasks.find(id); it != node.tasks.end())
              it->second.end_reported = true;
        } else {
          backoff = node.backoff_ms;
        }
      }
      if (answer) Apply(node, *answer);
      if (again) After(backoff, [this, &node] { Report(node); });
    });
  }

  // Level-triggered, as the agent: runs the desired tasks it lacks, ends the running ones no
  // longer desired, and forgets ended ones whose end the server has heard of.
  void Apply(Node& node, const api::SyncResponse& answer) {
    bool ended_any = false;
    std::vector<std::pair<std::string, TimeMs>> sleeps;  // workload id, how long
    {
      std::lock_guard lock(node.mu);
      node.known_version = answer.version;
      std::set<std::string> desired;
      const TimeMs now = WallMs();
      for (const api::TaskLaunch& launch : answer.desired) {
        desired.insert(launch.workload_id);
        auto [it, added] = node.tasks.try_emplace(launch.workload_id);
        if (!added) continue;
        Task& task = it->second;
        task.gpus = launch.gpu_indices;
        api::WorkloadReport& report = task.report;
        report.workload_id = launch.workload_id;
        report.job_id = launch.job_id;
        report.rank = launch.rank;
        report.attempt = launch.attempt;
        report.started_ms = now;
        std::string error;
        if (auto sleep = SleepMs(launch.argv, error)) {
          report.state = "running";
          ++launches;
          ++tasks_running;
          sleeps.emplace_back(launch.workload_id, *sleep);
        } else {
          report.state = "failed_to_start";
          report.error = error;
          report.finished_ms = now;
          ++refused;
          ended_any = true;
          Log(fmt::format("fleet: {}", error));
        }
      }
      for (auto it = node.tasks.begin(); it != node.tasks.end();) {
        Task& task = it->second;
        if (desired.count(it->first)) {
          ++it;
          continue;
        }
        if (task.report.state == "running") {
          task.report.state = "exited";
          task.report.signal = 15;  // as the agent's cancel: SIGTERM
          task.report.finished_ms = now;
          --tasks_running;
          ++cancelled;
          ended_any = true;
          ++it;
        } else if (task.end_reported) {
          it = node.tasks.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& [id, sleep_ms] : sleeps)
      After(sleep_ms, [this, &node, id = id] { SleepEnded(node, id); });
    if (ended_any) Report(node);
  }

  void SleepEnded(Node& node, const std::string& id) {
    {
      std::lock_guard lock(node.mu);
      auto it = node.tasks.find(id);
      if (it == node.tasks.end() || it->second.report.state != "running") return;
      it->second.report.state = "exited";
      it->second.report.exit_code = 0;
      it->second.report.finished_ms = WallMs();
      --tasks_running;
      ++finished;
    }
    Report(node);
  }

  void After(TimeMs delay_ms, std::function<void()> work) {
    if (stopping) return;
    client->After(milliseconds(delay_ms), [self = shared_from_this(), work = std::move(work)] {
      if (!self->stopping) work();
    });
  }
};

Fleet::Fleet(FleetOptions options) : state_(std::make_shared<State>(std::move(options))) {}

Fleet::~Fleet() {
  Stop();
}

std::optional<std::string> Fleet::Start() {
  State& s = *state_;
  const FleetOptions& options = s.options;
  if (options.nodes < 1) return "--fleet needs at least 1 node";
  if (options.nodes > 65000)
    return fmt::format("--fleet {}: at most 65000 nodes (one loopback address each)",
                       options.nodes);
  if (options.gpus_per_node < 0 || options.gpus_per_node > 64)
    return fmt::format("--fleet-gpus {}: from 0 to 64", options.gpus_per_node);
  if (options.token.empty()) return "the fleet needs an agent token";
  std::string error;
  auto servers = net::ServerUrls::Parse(options.server_url, error);
  if (!servers) return error;
  for (const std::string& url : servers->all()) {
    if (url.rfind("https://", 0) == 0)
      return fmt::format("the fleet simulator speaks plain HTTP only, not to {}", url);
  }
  s.servers = servers->all();
  s.client = std::make_unique<net::AsyncHttpClient>(options.threads);
  s.MakeNodes();
  const double spread_per_node =
      static_cast<double>(options.start_spread_ms) / static_cast<double>(options.nodes);
  for (auto& node : s.nodes) {
    State::Node* target = node.get();
    s.After(static_cast<TimeMs>(spread_per_node * target->index),
            [state = state_.get(), target] { state->LongPoll(*target); });
  }
  return std::nullopt;
}

void Fleet::Stop() {
  state_->stopping = true;
  if (!state_->client) return;
  state_->client->Stop();
  // Its handlers, dropped with it, hold the state: released here rather than never.
  state_->client.reset();
}

FleetStats Fleet::Stats() const {
  const State& s = *state_;
  FleetStats stats;
  stats.nodes_synced = s.nodes_synced;
  stats.syncs = s.syncs;
  stats.sync_errors = s.sync_errors;
  stats.tasks_running = s.tasks_running;
  stats.launches = s.launches;
  stats.refused = s.refused;
  stats.finished = s.finished;
  stats.cancelled = s.cancelled;
  return stats;
}

std::string Fleet::NodeName(int32_t index) const {
  return state_->NodeName(index);
}

std::string Fleet::NodeAddress(int32_t index) const {
  return state_->NodeAddress(index);
}

}  // namespace gpufleet::agent
