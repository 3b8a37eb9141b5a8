#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace gpufleet::cli {

// Flags of `gpufleet agent` and its subcommands (run, inject, status), as typed; RunAgent
// validates them.
struct AgentArgs {
  // The daemon, and the backend of `agent run`.
  bool standalone = false;
  std::string listen = "127.0.0.1:9400";
  std::string data_dir = ".gpufleet/agent";
  std::string sim_gpus;
  std::string sim_profile;
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string interval = "1s";
  std::string hostname;
  std::string cgroups = "auto";
  std::string gpu_sharing = "auto";
  std::string mps_control = "nvidia-cuda-mps-control";
  std::string workload_user = "auto";
  std::string workload_isolation = "auto";
  std::string oci_runtime = "auto";
  std::string container_init = "/usr/bin/tini-static";
  std::string image_cache_dir;  // empty: <data-dir>/images
  std::string image_cache_size = "20Gi";
  std::string cdi_dir = "/var/run/cdi";
  std::string sim_device_dir;
  // The control plane (daemon only): without --server the agent is standalone.
  std::string server;
  std::string token;  // else --token-file, else $GPUFLEET_TOKEN
  std::string token_file;
  std::string ca_file;  // trusted CA for an https:// --server; empty: the system's
  std::string address;  // advertised to the server (MASTER_ADDR); default from --listen
  std::string rack;
  std::string spine;
  // HTTPS for the agent's own API (the server reads logs through it; --agent-ca-file there).
  std::string tls_cert;
  std::string tls_key;

  // agent --fleet N: N simulated nodes (docs/scale.md)
  int32_t fleet = 0;
  int32_t fleet_gpus = 8;
  std::string fleet_model = "H100-80GB";
  std::string fleet_prefix = "fleet-";
  std::string fleet_spread = "5s";
  int32_t fleet_threads = 2;

  // agent run
  int32_t gpus = 0;
  std::string cpu;
  std::string memory;
  std::string grace = "10s";
  std::string max_runtime;
  std::vector<std::string> env;
  std::string workdir;
  std::string image;  // agent run in a container
  std::vector<std::string> mounts;
  std::string user;
  bool keep = false;
  std::vector<std::string> command;

  // agent inject / agent status
  std::string agent_url = "http://127.0.0.1:9400";
  std::string api_key_file;       // default: <data dir>/api-key when it exists
  std::string ca_file_for_agent;  // an https:// --agent's CA
  int32_t gpu = 0;
  std::string kind;
  int64_t code = 0;
  bool json = false;

  CLI::App* run = nullptr;
  CLI::App* inject = nullptr;
  CLI::App* status = nullptr;
};

CLI::App* AddAgentCommand(CLI::App& app, AgentArgs& args);

// Runs whichever of `agent`, `agent run`, `agent inject`, `agent status` was given. Exit status:
// the daemon 0 after SIGTERM/SIGINT; `run` the workload's exit code (128 + signal when killed);
// 2 for bad flags; 1 for other failures.
int RunAgent(const AgentArgs& args);

// The hidden `gpufleet agent-shim ...` (argv[0] = "agent-shim"): the per-workload supervisor.
int RunAgentShim(int argc, char** argv);

}  // namespace gpufleet::cli
