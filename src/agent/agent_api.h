#pragma once

// The agent's HTTP API over an AgentCore (JSON; /metrics in Prometheus text). docs/agent.md
// documents every route with examples.
//
//   GET  /healthz                              agent status (503 when sampling stalls)
//   GET  /metrics                              Prometheus text 0.0.4 (dcgm-exporter names)
//   GET  /v1/gpus                              inventory, latest sample, health, holders
//   POST /v1/workloads                         launch {argv, env, workdir, gpus, cpu, memory, ...}
//   GET  /v1/workloads                         all workloads
//   GET  /v1/workloads/{id}                    one workload
//   POST /v1/workloads/{id}/cancel             {grace} optional
//   GET  /v1/workloads/{id}/logs               ?stream=stdout|stderr&tail=N, or &offset=N
//                                              (X-Log-Next-Offset, X-Log-Finished, X-Log-Skipped)
//   POST /v1/sim/faults                        {gpu, kind, code}; simulated GPUs only (else 409)
//
// With an api_key (an agent that syncs with a server), every /v1 route needs
// "Authorization: Bearer <api_key>" (401 otherwise, counted in /metrics); /healthz and /metrics
// stay open, as telemetry. Without one (--standalone) the agent listens on loopback only.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "agent/agent.h"
#include "agent/control_loop.h"
#include "net/http.h"
#include "net/http_server.h"

namespace gpufleet::agent {

struct AgentApiOptions {
  bool standalone = true;  // no control plane; reported by /healthz
  // When it syncs with a server: /healthz shows the loop's state under "control_plane".
  const ControlLoop* control_loop = nullptr;
  // The credential every /v1 call must carry; empty: none (standalone, loopback only).
  std::string api_key;
  // The agent HTTP server's refusals and open connections, shown in /metrics when set.
  std::shared_ptr<net::HttpServerCounters> http_counters;
};

net::Router MakeAgentRouter(AgentCore& core, AgentApiOptions options = {});

// The body of POST /v1/workloads. Unknown fields, wrong types and bad quantities are errors
// (kBadRequest) that name the field.
AgentResult<LaunchRequest> ParseLaunchRequest(std::string_view json);
// The body of POST /v1/sim/faults.
AgentResult<SimFault> ParseFaultRequest(std::string_view json);

// A new API key ("gpa_" and 64 hex digits from the CSPRNG).
std::string NewApiKey();
// Writes `key` to `path` (mode 0600, replaced atomically), for `agent status|inject` on the node.
std::optional<std::string> WriteApiKeyFile(const std::string& path, const std::string& key);
// The key in `path`'s first line; nothing (and `error`) when unreadable or empty.
std::optional<std::string> ReadApiKeyFile(const std::string& path, std::string& error);

std::string WorkloadJson(const WorkloadView& view);
std::string GpuJson(const GpuView& view);

// "127.0.0.1:9400" -> host and port; ":9400" and a bare "9400" mean 127.0.0.1. Port 0 asks the
// kernel for a free one.
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};
std::optional<ListenAddress> ParseListenAddress(std::string_view text, std::string& error);

}  // namespace gpufleet::agent
