#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sched/queues.h"

namespace gpufleet::cli {

// Flags of `gpufleet server`, as typed; RunServer validates them.
struct ServerArgs {
  std::string data_dir = ".gpufleet/server";
  std::string listen = "127.0.0.1:8080";
  std::string node_timeout = "30s";
  std::string heartbeat = "5s";
  std::string schedule_interval = "1s";
  std::string policy = "fifo";
  std::string backfill;  // empty: the policy's default
  std::string placement = "binpack";
  bool preempt = false;
  std::string tls_cert;  // both or neither: HTTPS
  std::string tls_key;
  std::string checkpoint_root;
  std::string queues_file;  // team queues and quotas (docs/quotas.md); empty: queues by use
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
