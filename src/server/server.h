#pragma once

// The control plane behind `gpufleet server` (and `gpufleet dev`): the HTTP API of docs/api.md,
// its state in memory written through to the store before any 2xx, the scheduling loop that calls
// sched::Schedule, agents' long-polled syncs, lost-node detection, tokens and the audit log.
// See docs/server.md for its threads, store layout and failure rules.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "api/types.h"
#include "core/types.h"
#include "sched/policy.h"
#include "store/store.h"

namespace gpufleet::server {

struct ServerOptions {
  std::string data_dir = ".gpufleet/server";
  std::string host = "127.0.0.1";
  uint16_t port = 8080;                // 0: any free port; port() says which
  TimeMs node_timeout_ms = 30000;      // a node silent this long is lost
  TimeMs heartbeat_ms = 5000;          // agents sync at least this often; caps a long poll
  TimeMs schedule_interval_ms = 1000;  // a cycle at least this often, and on every change
  sched::SchedulerConfig scheduler;
  int io_threads = 4;
  // HTTPS with this PEM certificate (chain) and key when both are set; plain HTTP otherwise.
  std::string tls_cert_file;
  std::string tls_key_file;
  // For agents whose API is https (agent --tls-cert): the PEM CA that signed their certificates;
  // empty: the system's CAs.
  std::string agent_ca_file;
  // A directory every node sees (shared storage) for jobs' checkpoints; empty: each agent keeps
  // them in its own data dir.
  std::string checkpoint_root;
  // A running job all of whose GPUs report at most 1 % utilisation for this long is flagged idle
  // (and, in queues with reclaim_idle, preempted while other jobs wait); 0: never.
  TimeMs idle_gpu_timeout_ms = 30 * 60 * 1000;
  // Requests per second each user token may make, sustained, with bursts of twice that; beyond
  // it a 429 with Retry-After. Admin tokens (operators, their automation and benchmarks), agents
  // and gateways (whose syncs and long polls pace themselves) are not limited. 0: no limit.
  double token_rate_limit = 100;
  // Connections one client address may hold open to the API at once (slowloris); 0: no limit.
  // Raise it for many users behind one NAT or proxy.
  size_t max_connections_per_client = 256;
  // Connections open at once in all: every agent holds one (its long poll). 0: half the open-file
  // limit, at most 10000 (net::HttpServerOptions).
  size_t max_connections = 0;
  // One line per notable event (node registered or lost, store failure); nothing when unset.
  std::function<void(const std::string&)> log;
  // Opens the store; unset: SQLite in data_dir. Another backend (etcd), or a test's, goes here.
  // May throw store::StoreError.
  std::function<std::unique_ptr<store::Store>(const std::string& data_dir)> open_store;
};

// A token as created: the secret is returned here and never again.
struct CreatedToken {
  std::string secret;  // "gpf_" + 64 hex digits
  api::TokenInfo info;
};

class Server {
 public:
  struct OpenResult {
    std::unique_ptr<Server> server;  // set on success
    std::string error;               // why not: store unreadable or in use, port taken, ...
  };
  // Opens the store in data_dir, loads every job, node and token, starts the scheduling and
  // maintenance threads and serves HTTP.
  static OpenResult Open(ServerOptions options);

  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  std::string address() const;  // "127.0.0.1:8080"
  std::string url() const;      // "http://127.0.0.1:8080", or https:// with TLS
  // "sqlite at /path/state.db": what holds the state, for the startup banner.
  std::string store_description() const;

  // Answers every parked long poll, stops HTTP (requests in progress are answered), the threads,
  // then closes the store (its data dir may be opened again). Idempotent.
  void Stop();

  struct TokenResult {
    std::optional<CreatedToken> token;
    std::string error;  // when not created: bad name, store failure, stopped
  };
  // Creates a token in-process, durably and with its audit entry (`created_by` as the actor).
  // `gpufleet server` uses it for the first admin token, `gpufleet dev` for its agent's.
  TokenResult CreateToken(const std::string& user, const std::string& team, api::Role role,
                          const std::string& created_by);
  bool HasAdminToken() const;

  // Set once a store commit failed, or the store said it was lost (Store::Lost: another server
  // may lead now): from then on the server acknowledges no mutation, /readyz
  // fails, and the process should exit non-zero (a restart reloads what is durable).
  std::optional<std::string> fatal_error() const;
  // Waits up to `timeout` for a fatal error; returns it, or nothing when none happened.
  std::optional<std::string> WaitForFatal(std::chrono::milliseconds timeout) const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes `contents` to `path` readable by its owner only (0600), replacing it atomically: for the
// admin token file. Returns an error message, empty on success.
std::string WritePrivateFile(const std::string& path, const std::string& contents);

}  // namespace gpufleet::server
