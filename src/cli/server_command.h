#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/types.h"
#include "sched/policy.h"
#include "sched/queues.h"

namespace gpufleet::cli {

// The scheduler's flags, shared by `gpufleet server` and `gpufleet dev`, as typed.
struct SchedulerArgs {
  std::string policy = "fifo";
  std::string backfill;  // empty: the policy's default
  std::string placement = "binpack";
  bool preempt = false;
  std::string fair_share_half_life = "7d";
  std::string idle_gpu_timeout = "30m";  // "0" or "off": never flag idle jobs
  std::string queues_file;  // team queues and quotas (docs/quotas.md); empty: queues by use
};

void AddSchedulerOptions(CLI::App& command, SchedulerArgs& args);
// The configuration the flags ask for; nothing, after printing why, when one is invalid.
std::optional<sched::SchedulerConfig> SchedulerConfigFrom(const SchedulerArgs& args);
// "fairshare (backfill easy, placement binpack, usage half-life 7d)" for startup banners.
std::string DescribeScheduler(const sched::SchedulerConfig& config);
// --idle-gpu-timeout in ms (0: off); nothing, after printing why, when it is invalid.
std::optional<TimeMs> IdleGpuTimeoutMs(const SchedulerArgs& args);
// A duration flag that must be above zero; nothing, after printing why, otherwise.
std::optional<TimeMs> PositiveDuration(const std::string& flag, const std::string& text);

// Flags of `gpufleet server`, as typed; RunServer validates them.
struct ServerArgs {
  std::string data_dir = ".gpufleet/server";
  // "sqlite" (DATA_DIR/state.db) or "etcd://HOST:PORT,...[/PREFIX]" (docs/store.md).
  std::string store = "sqlite";
  std::string etcd_lease = "3s";  // how long a dead server's etcd lock outlives it
  std::string listen = "127.0.0.1:8080";
  // With etcd: where clients reach this server, written into the lock so that standbys redirect
  // to it; empty: from --listen (this host's name for a wildcard address).
  std::string advertise_url;
  std::string node_timeout = "30s";
  std::string heartbeat = "5s";
  std::string schedule_interval = "1s";
  SchedulerArgs scheduler;
  std::string tls_cert;  // both or neither: HTTPS
  std::string tls_key;
  std::string agent_ca_file;      // trusted CA for agents serving https
  double token_rate_limit = 100;  // requests/s per user token; 0: none
  size_t max_connections_per_client = 256;
  size_t max_connections = 0;
  std::string checkpoint_root;
};

CLI::App* AddServerCommand(CLI::App& app, ServerArgs& args);

// The queues of a --queues file for the server (no trace `members`); nothing, after printing
// why, when the file is unreadable or wrong.
std::optional<std::vector<sched::QueueConfig>> LoadServerQueues(const std::string& path);
// "a (guarantee 8 GPUs, cohort research), b (...)" for startup banners.
std::string DescribeQueues(const std::vector<sched::QueueConfig>& queues);

// Runs the control plane until SIGINT or SIGTERM. Exit status: 0 after a signal, 2 for bad flags,
// 1 when it cannot start or its store fails (a restart reloads what is durable).
int RunServer(const ServerArgs& args);

}  // namespace gpufleet::cli
