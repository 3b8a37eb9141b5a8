#pragma once

// `gpufleet dev`: the control plane, one node agent and the inference gateway in one process, on
// this machine. What a new user runs first (`make run`).

#include <string>

#include <CLI/CLI.hpp>

#include "cli/server_command.h"

namespace gpufleet::cli {

struct DevArgs {
  std::string dir = ".gpufleet";  // server/, agent/, client.json, agent-token
  std::string listen = "127.0.0.1:8080";
  std::string agent_listen = "127.0.0.1:0";
  std::string gateway_listen = "127.0.0.1:8000";  // the inference gateway (docs/gateway.md)
  std::string sim_gpus;       // empty: NVML, else simulated 8xH100-80GB (said at start)
  bool require_nvml = false;  // fail instead of simulating when NVML finds no GPU
  SchedulerArgs scheduler;
  std::string node_timeout = "30s";
};

CLI::App* AddDevCommand(CLI::App& app, DevArgs& args);
int RunDev(const DevArgs& args);

}  // namespace gpufleet::cli
