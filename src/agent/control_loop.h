#pragma once

// The agent's side of the control plane: one thread that syncs this node with the server
// (POST /api/v1/agents/sync, docs/api.md) and makes the node run what the server wants.
//
// Each sync sends the node report (GPUs with health and telemetry, address, agent URL) and every
// job workload's state, and long-polls for the desired tasks. The answer is applied
// level-triggered: desired tasks the node lacks are launched on exactly their GPUs, job workloads
// not desired are cancelled, workloads without a job (`agent run`, the agent's own API) are never
// touched. A launch that fails is reported as failed_to_start. While a long poll is outstanding
// the loop checks the workloads it reported as running every watch interval and reports an end at
// once with a second, short sync. See docs/agent.md.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "agent/agent.h"
#include "core/types.h"

namespace gpufleet::agent {

// How a node paces its syncs; the fleet simulator (fleet.h) syncs as the agent does with these.
// An HTTP call may take kSyncCallMarginMs longer than the wait it asked the server for. A failed
// sync is retried after a backoff from kSyncFirstBackoffMs doubling to kSyncMaxBackoffMs. A long
// poll answered within kQuickAnswerMs with nothing new (a server that does not hold, or one that
// released the poll for the watcher's short sync) is re-sent only after kQuickAnswerPauseMs, so
// the loop never spins.
inline constexpr std::string_view kSyncPath = "/api/v1/agents/sync";
inline constexpr TimeMs kSyncCallMarginMs = 3000;
inline constexpr TimeMs kSyncFirstBackoffMs = 100;
inline constexpr TimeMs kSyncMaxBackoffMs = 5000;
inline constexpr TimeMs kQuickAnswerMs = 20;
inline constexpr TimeMs kQuickAnswerPauseMs = 50;

struct ControlLoopOptions {
  // "http://10.0.0.1:8080": the server's base URL, or several, comma-separated, of which one
  // leads and the others are standbys (docs/ha.md): syncs follow whichever answers.
  std::string server_url;
  std::string token;      // sent as "Authorization: Bearer <token>"
  std::string ca_file;    // for an https:// server: trust this PEM CA; empty: the system's CAs
  std::string node_name;  // empty: core.hostname()
  std::string address = "127.0.0.1";  // the IP other nodes reach this one at (MASTER_ADDR)
  std::string agent_url;              // this agent's API, through which the server reads logs
  std::string api_key;  // what the server must send to agent_url (AgentApiOptions::api_key)
  std::string rack;
  std::string spine;
  TimeMs wait_ms = 5000;  // how long the server may hold a sync (the long poll)
  // How often, during a long poll, the workloads reported as running are checked for an end.
  TimeMs watch_interval_ms = 200;
  // Finished job workloads the server no longer wants keep their logs this long; past
  // max_finished of them, the oldest go first. Checked at most every gc_interval_ms.
  TimeMs retention_ms = 24 * 3600 * kMsPerSecond;
  size_t max_finished = 1000;
  TimeMs gc_interval_ms = 60 * kMsPerSecond;
  // Where the loop's events go (launches, cancels, errors once each); default: stderr with time.
  std::function<void(const std::string&)> log;
};

struct ControlLoopStatus {
  bool running = false;
  bool connected = false;      // the latest sync succeeded
  TimeMs last_sync_ms = 0;     // wall clock of the latest successful sync; 0 = none yet
  uint64_t known_version = 0;  // of the desired state last applied
  std::string last_error;      // of the latest failed sync; empty once one succeeds
  int64_t syncs = 0;           // successful syncs
  int64_t launches = 0;
  int64_t launch_failures = 0;
  int64_t cancels = 0;
  int64_t forgotten = 0;  // finished workloads garbage-collected
};

class ControlLoop {
 public:
  ControlLoop(AgentCore& core, ControlLoopOptions options);
  // Stop().
  ~ControlLoop();
  ControlLoop(const ControlLoop&) = delete;
  ControlLoop& operator=(const ControlLoop&) = delete;

  // Checks the options (a usable server URL) and starts the thread; why not otherwise.
  std::optional<std::string> Start();
  // Ends the thread promptly, also in the middle of a long poll (the HTTP call is left to finish
  // on its own within its timeout; nothing it returns is used). Workloads keep running.
  // Idempotent.
  void Stop();

  // Before Start(): the agent's URL is known once its API listens (port 0 picks one).
  void set_agent_url(std::string url);

  ControlLoopStatus Status() const;
  const ControlLoopOptions& options() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace gpufleet::agent
