#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace gpufleet::cli {

// Flags of `gpufleet sim`, as typed; RunSim validates them.
struct SimArgs {
  std::string trace;
  std::string format = "detect";
  // Uniform cluster shape (defaults: core's UniformClusterShape).
  int32_t nodes = 64;
  int32_t gpus_per_node = 8;
  int32_t nodes_per_rack = 16;
  int32_t racks_per_spine = 8;
  int32_t gpus_per_island = 8;
  std::string gpu_model = "H100-80GB";
  std::string alibaba_nodes;  // node list instead of a uniform shape

  std::string policy = "fifo";
  std::string backfill;  // empty: the policy's default
  std::string placement = "binpack";
  bool preempt = false;
  std::vector<int64_t> las_limits_gpu_s;  // empty: the scheduler's default
  std::string queues;                     // team queues file (YAML); empty: no queues
  std::string queue_by = "vc";            // vc | user | round-robin
  double restart_cost_s = 30;
  double grace_period_s = 0;
  std::string fair_share_half_life = "7d";  // fairshare: how fast usage is forgotten
  std::string estimates;                    // empty: oracle for sjf and EASY backfill, else none
  std::string mode = "replay";
  double fill_arrived = 0;          // fill: 0 stops at the first failure, else the paper's measure
  uint64_t fill_shuffle_seed = 0;   // fill: 0 keeps file order
  std::string fgd_weight = "gpus";  // how FGD weighs the trace's task shapes
  std::optional<double> load;       // empty: arrival times as recorded
  bool skip_invalid = false;
  int64_t limit = 0;
  bool json = false;
  std::string plot;
  bool compare = false;

  // --serving: replay an inference request trace under kpa, target-tracking and fixed-at-peak.
  bool serving = false;
  std::string requests;                  // request trace file
  std::string request_format = "genai";  // genai | azure
  std::optional<double> target;          // per replica; default: the replica concurrency
  std::string metric = "concurrency";    // concurrency | rps
  double target_utilization = 0.7;
  int32_t min_replicas = 0;
  int32_t max_replicas = 100;
  std::string stable_window = "60s";
  std::string panic_window = "6s";
  double panic_threshold = 2.0;
  double max_scale_up_rate = 1000;
  double max_scale_down_rate = 2;
  std::string scale_to_zero_grace = "30s";
  std::string scale_down_delay = "0s";
  std::string scale_in_cooldown = "300s";  // target-tracking
  std::string tick = "2s";
  std::string cold_start = "30s";
  int32_t replica_concurrency = 1;
  int32_t gpus_per_replica = 1;
  std::string slo = "60s";
  double prefill_ms_per_1k_tokens = 100;  // azure: service time model
  double decode_ms_per_token = 15;

  // The subcommand, set by AddSimCommand: which flags were given on the command line.
  const CLI::App* command = nullptr;
};

CLI::App* AddSimCommand(CLI::App& app, SimArgs& args);

// Exit status: 0 on success, 2 for bad input (flags, trace, cluster), 1 when the simulation
// itself fails or the output cannot be written.
int RunSim(const SimArgs& args);

}  // namespace gpufleet::cli
