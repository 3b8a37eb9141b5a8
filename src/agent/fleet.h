#pragma once

// `gpufleet agent --fleet N`: N simulated nodes in one process, for measuring the control plane
// at thousands of nodes from one machine (docs/scale.md). Each node syncs with the server as an
// agent does (POST /api/v1/agents/sync: its node report, its workloads' states and a long poll
// for its desired tasks) from its own loopback source address, as real nodes come from their own
// addresses, and runs each task it is given as a timed sleep: `sleep SECONDS` ends with code 0
// after that long; any other command fails to start, saying so. Its nodes report backend "fleet"
// and GPUs the process does not have: they are a simulator, and the server shows them as such.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/types.h"

namespace gpufleet::agent {

struct FleetOptions {
  std::string server_url;  // one base URL, or a leader and its standbys comma-separated
  std::string token;       // an agent (or admin) token
  int32_t nodes = 0;
  int32_t gpus_per_node = 8;
  std::string gpu_model = "H100-80GB";
  MiB gpu_memory_mib = 81559;
  MilliCpu cpu_milli_per_node = 128000;
  MiB memory_mib_per_node = 1 << 20;
  std::string name_prefix = "fleet-";  // node i is fleet-00001 ...
  int32_t nodes_per_rack = 32;         // racks of nodes_per_rack, spines of racks_per_spine racks
  int32_t racks_per_spine = 16;
  // Node i syncs from 127.10.0.0 + i + 1 (127.10.0.1, 127.10.0.2, ...), all of it loopback.
  uint32_t first_address = (127u << 24) | (10u << 16);
  TimeMs wait_ms = 5000;  // the long poll, as the agent's
  // Nodes start one after another over this long, so that thousands do not register at once.
  TimeMs start_spread_ms = 5000;
  int threads = 2;
  std::function<void(const std::string&)> log;  // errors, once per kind; default stderr
};

struct FleetStats {
  int64_t nodes_synced = 0;  // nodes whose latest sync succeeded
  int64_t syncs = 0;         // successful, long polls and reports
  int64_t sync_errors = 0;
  int64_t tasks_running = 0;
  int64_t launches = 0;
  int64_t refused = 0;    // not a `sleep SECONDS`: reported failed_to_start
  int64_t finished = 0;   // slept their time and exited 0
  int64_t cancelled = 0;  // no longer desired while running
};

class Fleet {
 public:
  explicit Fleet(FleetOptions options);
  ~Fleet();  // Stop()
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Checks the options and starts the nodes; why not otherwise.
  std::optional<std::string> Start();
  // Ends every sync and sleep at once (the server sees the nodes go silent). Idempotent.
  void Stop();
  FleetStats Stats() const;
  std::string NodeName(int32_t index) const;     // index from 0
  std::string NodeAddress(int32_t index) const;  // its source address

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace gpufleet::agent
