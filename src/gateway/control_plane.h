#pragma once

// A gateway's link to the control plane (docs/serving.md): it long-polls the server's endpoint
// set (GET /api/v1/endpoints) and hands it to the gateway whole (level-triggered: a gateway that
// restarts or misses an answer converges on the next), and reports each deployment's load every
// interval (POST /api/v1/gateways/report), at once when a request waits for a deployment that
// has no replica, so the autoscaler scales it from zero without waiting for a tick.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/types.h"
#include "gateway/gateway.h"

namespace gpufleet::gateway {

struct ControlPlaneOptions {
  std::string server_url;  // "http://10.0.0.1:8080", or a leader and its standbys, comma-separated
  std::string token;       // a token of role gateway (or admin)
  std::string ca_file;     // for an https:// server; empty: the system's CAs
  std::string gateway_id;  // stable across reports: the server sums gateways by it
  TimeMs report_interval_ms = 1000;
  TimeMs watch_wait_ms = 30000;  // how long the server may hold a watch
  std::function<void(const std::string&)> log;
};

class ControlPlaneLink {
 public:
  ControlPlaneLink(Gateway& gateway, ControlPlaneOptions options);
  ~ControlPlaneLink();  // Stop()
  ControlPlaneLink(const ControlPlaneLink&) = delete;
  ControlPlaneLink& operator=(const ControlPlaneLink&) = delete;

  // Checks the URL, registers for the gateway's demand and starts the two threads.
  std::optional<std::string> Start();
  // Returns promptly, also during a long poll (the call is left to end within its timeout).
  void Stop();

  // Whether the first endpoint set has arrived.
  bool synced() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Checks a caller's bearer token against the server (GET /api/v1/whoami): people's tokens
// (admin, user) only; a gateway's or agent's own token may not call models. Blocking: the gateway
// calls it off its io threads and caches the answer.
std::function<std::optional<Caller>(const std::string&)> ServerTokenVerifier(std::string server_url,
                                                                             std::string ca_file);

}  // namespace gpufleet::gateway
