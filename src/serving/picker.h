#pragma once

// Which replica of a deployment gets the next request: round robin, least outstanding (power of
// two choices) or an endpoint picker modelled on the Gateway API Inference Extension's (EPP):
// filters on queue depth and KV-cache use, then weighted scorers (approximate prefix-cache
// affinity, queue, KV cache, LoRA affinity) and the best score. Pure: the gateway passes the
// endpoints' state, the time and a random draw, and keeps the returned state (docs/gateway.md).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/types.h"

namespace gpufleet::serving {

enum class RoutingPolicy { kRoundRobin, kLeastOutstanding, kEndpointPicker };

std::optional<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
std::string_view RoutingPolicyName(RoutingPolicy policy);

// What a model server's /metrics said (vLLM names), and when it was read.
struct EndpointMetrics {
  int64_t waiting = 0;        // vllm:num_requests_waiting
  int64_t running = 0;        // vllm:num_requests_running
  double kv_cache_usage = 0;  // vllm:kv_cache_usage_perc, 0..1
  int max_lora = 0;           // vllm:lora_requests_info's max_lora label
  std::set<std::string> running_adapters;
  std::set<std::string> waiting_adapters;
  TimeMs scraped_at = 0;
};

// Reads the vLLM series above from a Prometheus text exposition; series with several label sets
// are summed (gauges of one engine per model). vllm:gpu_cache_usage_perc, the older name, counts
// when the new one is absent. Nothing when none of the series is present.
std::optional<EndpointMetrics> ParseVllmMetrics(std::string_view text, TimeMs now);

struct EndpointState {
  std::string id;
  int64_t in_flight = 0;  // requests this gateway sent that are not answered yet
  std::optional<EndpointMetrics> metrics;
};

struct PickRequest {
  std::string model;    // the request's `model` (or the deployment's name): seeds the prefix hash
  std::string adapter;  // a LoRA adapter the request names; empty for the base model
  std::string_view prompt;  // a view: the caller keeps the text alive during the call
};

struct PickerConfig {
  RoutingPolicy policy = RoutingPolicy::kLeastOutstanding;
  // Metrics older than this make the endpoint picker fall back to least outstanding.
  TimeMs stale_metrics_ms = 1000;
  // EPP's defaults: 64 characters per block (vLLM's 16 tokens at ~4 characters a token), at most
  // 256 blocks of a prompt, 31250 blocks remembered per endpoint.
  size_t block_size = 64;
  size_t max_blocks = 256;
  size_t lru_capacity_per_endpoint = 31250;
  // Filters: endpoints with at most this many waiting requests and at most this KV-cache use are
  // preferred (EPP's queueingThresholdLoRA and kvCacheThreshold); a filter that would leave none
  // is skipped.
  int64_t queue_threshold = 128;
  double kv_cache_threshold = 0.8;
  double prefix_weight = 3;
  double queue_weight = 2;
  double kv_cache_weight = 2;
  double lora_weight = 1;
};

// Prompt blocks hashed in a chain: block i's hash covers its bytes and block i-1's hash (block
// 0's, the model's name), so equal hashes mean equal prefixes of the same model. One hash per
// whole block; a last partial block is left out.
std::vector<uint64_t> HashPrompt(std::string_view model, std::string_view prompt, size_t block_size,
                                 size_t max_blocks);

// Which endpoints recently served which prompt blocks: an approximation of their prefix caches,
// bounded per endpoint, the least recently used block forgotten first.
class PrefixIndex {
 public:
  // Blocks of `hashes` each endpoint holds from the start (the longest matching prefix).
  std::map<std::string, size_t> Match(const std::vector<uint64_t>& hashes) const;
  void Add(const std::vector<uint64_t>& hashes, const std::string& endpoint, size_t capacity);
  // Forgets endpoints that are gone.
  void RetainOnly(const std::set<std::string>& endpoints);
  size_t BlocksOf(const std::string& endpoint) const;

 private:
  struct PerEndpoint {
    uint64_t clock = 0;
    std::unordered_map<uint64_t, uint64_t> last_use;  // block -> clock
    std::map<uint64_t, uint64_t> by_use;              // clock -> block
  };
  std::map<std::string, PerEndpoint> endpoints_;
  std::unordered_map<uint64_t, std::set<std::string>> holders_;
};

// What the gateway keeps between picks for one deployment.
struct PickerState {
  uint64_t next_round_robin = 0;
  PrefixIndex prefixes;
};

struct Pick {
  size_t index = 0;        // into the candidates
  bool fell_back = false;  // stale or missing metrics: least outstanding instead of the picker
  std::vector<uint64_t> hashes;  // the prompt's block hashes, for Record
};

// Chooses among `candidates` (non-empty; the gateway has removed draining and ejected ones).
// `random` is a uniformly random 64-bit draw.
Pick ChooseEndpoint(const PickerState& state, const std::vector<EndpointState>& candidates,
                    const PickRequest& request, const PickerConfig& config, TimeMs now,
                    uint64_t random);
// Records that the request went to `endpoint`: the round-robin cursor moves on and the prompt's
// blocks count as cached there.
void RecordPick(PickerState& state, const Pick& pick, const std::string& endpoint,
                const PickerConfig& config);

}  // namespace gpufleet::serving
