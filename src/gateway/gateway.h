#pragma once

// The inference front door (docs/gateway.md): an HTTP/1.1 reverse proxy that routes each request
// to a ready replica of a deployment (by Host, by a /d/NAME/ prefix, or by the OpenAI `model`
// field), with keep-alive pools to the replicas, streamed bodies (SSE passes through chunk by
// chunk), retries, outlier ejection, a bounded buffer while a deployment scales from zero, and
// per-deployment Prometheus metrics. Beast and Asio stay inside gateway.cpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/types.h"
#include "serving/picker.h"

namespace gpufleet::gateway {

struct Endpoint {
  std::string id;  // the replica's id, e.g. "j42"
  std::string host;
  uint16_t port = 0;
  bool draining = false;  // gets no new requests; those in flight finish
};

struct Route {
  std::string deployment;
  std::string team;
  // Names the OpenAI `model` field may give besides the deployment's own: the served model first,
  // then LoRA adapters. A name other than the deployment's and the first counts as an adapter.
  std::vector<std::string> model_names;
  std::vector<Endpoint> endpoints;  // the ready ones
  bool llm = false;  // scrape the replicas' vLLM metrics and route with the endpoint picker
  // This route's replica choice (a deployment's `routing`); unset: the gateway's policy.
  std::optional<serving::RoutingPolicy> policy;
};

struct Caller {
  std::string user;
  std::string team;
  bool admin = false;
};

struct GatewayOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks
  int io_threads = 2;
  size_t max_body_bytes = size_t{16} << 20;  // larger request bodies are answered 413
  size_t max_header_bytes = size_t{16} << 10;
  // Waiting for a replica's response header after the request went out.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(300)};
  // Silence on a connection: a client between requests, an upstream between body pieces, and
  // how long an idle pooled upstream connection is kept.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  // Client connections open at once from one address (so slow or greedy clients cannot hold
  // them all; 0: no per-client limit) and in all (0: half the open-file limit, at most 10000).
  // One more is answered 503 and closed.
  size_t max_connections_per_client = 256;
  size_t max_connections = 0;
  // Scale from zero: requests held per deployment while it has no ready endpoint, and how long.
  int64_t max_buffered_per_deployment = 100;
  std::chrono::milliseconds buffer_timeout{std::chrono::seconds(60)};
  int retry_after_s = 5;  // the Retry-After of a 503
  int retries = 2;        // further replicas tried after a failure (docs/gateway.md)
  // Outlier ejection: a replica failing this many times in a row is left out for the base time,
  // longer each time it is ejected again.
  int eject_after_failures = 5;
  std::chrono::milliseconds ejection_time{std::chrono::seconds(30)};
  serving::PickerConfig picker;  // the policy of plain routes; llm routes use endpoint_picker
  std::chrono::milliseconds scrape_interval{50};
  // Bearer token -> caller, or nothing when invalid. May block: called off the io threads and
  // cached (positive and negative results) for the TTLs below.
  std::function<std::optional<Caller>(const std::string& bearer_token)> verify_token;
  bool auth_disabled = false;  // every request is an admin's; only with no verify_token
  std::chrono::milliseconds token_cache_ttl{std::chrono::seconds(30)};
  std::chrono::milliseconds negative_token_cache_ttl{std::chrono::seconds(5)};
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
};

class Gateway {
 public:
  struct StartResult {
    std::unique_ptr<Gateway> gateway;
    std::string error;
  };
  static StartResult Start(GatewayOptions options);

  ~Gateway();  // Stop()
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The whole set of routes (level-triggered), from any thread. Buffered requests of a
  // deployment that gains an endpoint are sent at once.
  void SetRoutes(std::vector<Route> routes);

  using DemandCallback = std::function<void(const std::string& deployment)>;
  // Called (off the io threads) when a request is buffered for a deployment without endpoints.
  void OnDemand(DemandCallback callback);

  struct DeploymentLoad {
    std::string deployment;
    double concurrency = 0;  // time-averaged in-flight + buffered since the last TakeLoad
    uint64_t arrivals = 0;
    int64_t buffered = 0;                                  // now
    std::map<std::string, int64_t> in_flight_by_endpoint;  // now
    TimeMs interval_ms = 0;
  };
  // Load of every deployment with routes or traffic since the last call, which starts a new
  // interval.
  std::vector<DeploymentLoad> TakeLoad();

  std::string MetricsText() const;  // Prometheus text, also served on GET /metrics
  uint16_t port() const;
  std::string url() const;  // "http://127.0.0.1:PORT"
  // Stops accepting, lets requests in progress finish (within stop_timeout), joins the threads.
  void Stop();

  struct Impl;

 private:
  explicit Gateway(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace gpufleet::gateway
