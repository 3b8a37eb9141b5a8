#include "gateway/control_plane.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/json.h"
#include "net/http_client.h"
#include "net/server_urls.h"

namespace gpufleet::gateway {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr TimeMs kFirstBackoffMs = 100;
constexpr TimeMs kMaxBackoffMs = 5000;
constexpr TimeMs kCallMarginMs = 5000;

std::vector<Route> RoutesOf(const api::EndpointSet& set) {
  std::vector<Route> routes;
  for (const api::DeploymentEndpoints& deployment : set.deployments) {
    Route route;
    route.deployment = deployment.name;
    route.team = deployment.team;
    route.model_names = deployment.models;
    // The endpoint picker makes it an llm route (Gateway::SetRoutes).
    route.policy = serving::ParseRoutingPolicy(deployment.routing);
    for (const api::EndpointInfo& endpoint : deployment.endpoints) {
      if (endpoint.port <= 0 || endpoint.port > 65535) continue;
      route.endpoints.push_back(
          Endpoint{endpoint.id, endpoint.host, static_cast<uint16_t>(endpoint.port), false});
    }
    routes.push_back(std::move(route));
  }
  return routes;
}

}  // namespace

// Shared with the threads, which may outlive Stop() by one HTTP call: they touch the gateway only
// under `mu` while `gateway` is set.
struct ControlPlaneLink::State {
  ControlPlaneOptions options;
  std::optional<net::ServerUrls> servers;  // the server, or a leader and its standbys
  std::mutex mu;
  std::condition_variable cv;
  Gateway* gateway = nullptr;
  bool stopping = false;
  bool demand = false;  // a report is wanted now
  bool synced = false;
  std::string logged_error;  // each distinct failure logged once
  std::thread watch_thread;
  std::thread report_thread;

  void Log(const std::string& line) {
    if (options.log) options.log(line);
  }
  void NoteError(const std::string& what, const std::string& error) {
    std::lock_guard lock(mu);
    if (stopping) return;  // a call that ended after Stop(): nobody is listening
    const std::string line = fmt::format("{}: {}", what, error);
    if (line != logged_error) Log(line);
    logged_error = line;
  }
  net::HttpCallOptions Call(TimeMs timeout_ms) const {
    net::HttpCallOptions call;
    call.timeout = milliseconds(timeout_ms);
    call.ca_file = options.ca_file;
    call.headers.emplace_back("Authorization", "Bearer " + options.token);
    return call;
  }
  // Sleeps up to `ms` or until stopping; false when stopping.
  bool Pause(TimeMs ms) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, milliseconds(ms), [&] { return stopping; });
    return !stopping;
  }

  void Watch() {
    uint64_t version = 0;
    TimeMs backoff = 0;
    for (;;) {
      {
        std::lock_guard lock(mu);
        if (stopping) return;
      }
      const std::string path = fmt::format("/api/v1/endpoints?version={}&wait_ms={}", version,
                                           synced ? options.watch_wait_ms : 0);
      net::HttpResult result =
          servers->Call("GET", path, Call(options.watch_wait_ms + kCallMarginMs));
      std::string error;
      std::optional<api::EndpointSet> set;
      if (!result.ok()) {
        error = result.error;
      } else if (result.response->status != 200) {
        error = fmt::format("HTTP {}: {}", result.response->status, result.response->body);
      } else {
        try {
          set = json::parse(result.response->body).get<api::EndpointSet>();
        } catch (const std::exception& parse_error) {
          error = fmt::format("not an endpoint set: {}", parse_error.what());
        }
      }
      if (!set) {
        NoteError("watching the endpoints failed", error);
        backoff = backoff == 0 ? kFirstBackoffMs : std::min(backoff * 2, kMaxBackoffMs);
        if (!Pause(backoff)) return;
        continue;
      }
      backoff = 0;
      version = set->version;
      std::lock_guard lock(mu);
      if (stopping || !gateway) return;
      gateway->SetRoutes(RoutesOf(*set));
      if (!synced || !logged_error.empty())
        Log(fmt::format("endpoints from {}: {} deployment(s)", servers->current(),
                        set->deployments.size()));
      synced = true;
      logged_error.clear();
    }
  }

  void Report() {
    auto last = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::unique_lock lock(mu);
        cv.wait_until(lock, last + milliseconds(options.report_interval_ms),
                      [&] { return stopping || demand; });
        if (stopping) return;
        demand = false;
      }
      last = std::chrono::steady_clock::now();
      api::GatewayReport report;
      report.gateway = options.gateway_id;
      Gateway* target = nullptr;
      {
        std::lock_guard lock(mu);
        target = gateway;
      }
      // Not under `mu`: Stop() joins this thread before the gateway may go.
      if (!target) return;
      {
        for (Gateway::DeploymentLoad& load : target->TakeLoad()) {
          report.interval_ms = std::max(report.interval_ms, load.interval_ms);
          api::DeploymentLoadReport entry;
          entry.name = load.deployment;
          entry.concurrency = load.concurrency;
          entry.arrivals = static_cast<double>(load.arrivals);
          entry.buffered = load.buffered;
          entry.in_flight = std::move(load.in_flight_by_endpoint);
          report.deployments.push_back(std::move(entry));
        }
      }
      net::HttpCallOptions call = Call(kCallMarginMs);
      call.body = json(report).dump();
      net::HttpResult result = servers->Call("POST", "/api/v1/gateways/report", call);
      if (!result.ok())
        NoteError("reporting load failed", result.error);
      else if (result.response->status != 200)
        NoteError("reporting load failed",
                  fmt::format("HTTP {}: {}", result.response->status, result.response->body));
    }
  }
};

ControlPlaneLink::ControlPlaneLink(Gateway& gateway, ControlPlaneOptions options)
    : state_(std::make_shared<State>()) {
  state_->options = std::move(options);
  state_->gateway = &gateway;
}

ControlPlaneLink::~ControlPlaneLink() {
  Stop();
}

std::optional<std::string> ControlPlaneLink::Start() {
  State& state = *state_;
  std::string error;
  state.servers = net::ServerUrls::Parse(state.options.server_url, error);
  if (!state.servers) return fmt::format("--server: {}", error);
  if (state.options.gateway_id.empty()) return "the gateway needs an id for its reports";
  std::weak_ptr<State> weak = state_;
  state.gateway->OnDemand([weak](const std::string&) {
    if (auto shared = weak.lock()) {
      std::lock_guard lock(shared->mu);
      shared->demand = true;
      shared->cv.notify_all();
    }
  });
  try {
    state.watch_thread = std::thread([shared = state_] { shared->Watch(); });
    state.report_thread = std::thread([shared = state_] { shared->Report(); });
  } catch (const std::system_error& thread_error) {
    Stop();
    return fmt::format("start the control-plane threads: {}", thread_error.what());
  }
  return std::nullopt;
}

void ControlPlaneLink::Stop() {
  State& state = *state_;
  Gateway* gateway = nullptr;
  {
    std::lock_guard lock(state.mu);
    state.stopping = true;
    gateway = std::exchange(state.gateway, nullptr);
  }
  if (gateway) gateway->OnDemand(nullptr);
  state.cv.notify_all();
  // The watch may be inside a long poll: it ends on its own and finds `stopping`.
  if (state.watch_thread.joinable()) state.watch_thread.detach();
  if (state.report_thread.joinable()) state.report_thread.join();
}

bool ControlPlaneLink::synced() const {
  std::lock_guard lock(state_->mu);
  return state_->synced;
}

std::function<std::optional<Caller>(const std::string&)> ServerTokenVerifier(std::string server_url,
                                                                             std::string ca_file) {
  std::string error;  // a bad URL verifies no token; ControlPlaneLink::Start says why
  return [servers = net::ServerUrls::Parse(server_url, error),
          ca_file = std::move(ca_file)](const std::string& token) -> std::optional<Caller> {
    if (!servers) return std::nullopt;
    net::HttpCallOptions call;
    call.timeout = milliseconds(5000);
    call.ca_file = ca_file;
    call.headers.emplace_back("Authorization", "Bearer " + token);
    net::HttpResult result = servers->Call("GET", "/api/v1/whoami", call);
    if (!result.ok() || result.response->status != 200) return std::nullopt;
    try {
      const json body = json::parse(result.response->body);
      const std::string role = body.at("role").get<std::string>();
      if (role != "admin" && role != "user") return std::nullopt;
      return Caller{body.value("user", ""), body.value("team", ""), role == "admin"};
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
}

}  // namespace gpufleet::gateway
