#include "serving/picker.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace gpufleet::serving {
namespace {

// FNV-1a, 64 bits: stable across builds and platforms, which std::hash does not promise.
uint64_t Fnv1a(std::string_view bytes, uint64_t hash = 14695981039346656037ull) {
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

uint64_t ChainHash(std::string_view block, uint64_t previous) {
  char previous_bytes[8];
  for (int i = 0; i < 8; ++i)
    previous_bytes[i] = static_cast<char>((previous >> (8 * i)) & 0xff);
  return Fnv1a(std::string_view(previous_bytes, 8), Fnv1a(block));
}

size_t LeastOutstanding(const std::vector<EndpointState>& candidates, uint64_t random) {
  const size_t n = candidates.size();
  if (n == 1) return 0;
  // Two distinct candidates drawn from the two halves of the random word.
  const size_t first = static_cast<size_t>(random % n);
  const size_t second = (first + 1 + static_cast<size_t>((random >> 32) % (n - 1))) % n;
  return candidates[second].in_flight < candidates[first].in_flight ? second : first;
}

// The value of a sample line "name{labels} value [timestamp]"; nothing when malformed.
std::optional<double> SampleValue(std::string_view rest) {
  while (!rest.empty() && rest.front() == ' ')
    rest.remove_prefix(1);
  const size_t end = rest.find(' ');
  std::string value(rest.substr(0, end));
  if (value.empty()) return std::nullopt;
  char* parsed_end = nullptr;
  const double number = std::strtod(value.c_str(), &parsed_end);
  if (parsed_end != value.c_str() + value.size() || std::isnan(number)) return std::nullopt;
  return number;
}

// The value of label `name` in "{a="x",b="y"}" (escapes are not expected in these labels).
std::string LabelValue(std::string_view labels, std::string_view name) {
  const std::string key = std::string(name) + "=\"";
  size_t at = 0;
  while ((at = labels.find(key, at)) != std::string_view::npos) {
    if (at == 0 || labels[at - 1] == '{' || labels[at - 1] == ',') {
      const size_t start = at + key.size();
      const size_t end = labels.find('"', start);
      if (end == std::string_view::npos) return {};
      return std::string(labels.substr(start, end - start));
    }
    at += key.size();
  }
  return {};
}

std::set<std::string> SplitList(const std::string& list) {
  std::set<std::string> names;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(start, end - start);
    if (!name.empty()) names.insert(std::move(name));
    start = end + 1;
  }
  return names;
}

}  // namespace

std::optional<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  if (name == "least_outstanding") return RoutingPolicy::kLeastOutstanding;
  if (name == "endpoint_picker") return RoutingPolicy::kEndpointPicker;
  return std::nullopt;
}

std::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return "round_robin";
    case RoutingPolicy::kLeastOutstanding:
      return "least_outstanding";
    case RoutingPolicy::kEndpointPicker:
      return "endpoint_picker";
  }
  return "unknown";
}

std::optional<EndpointMetrics> ParseVllmMetrics(std::string_view text, TimeMs now) {
  EndpointMetrics metrics;
  metrics.scraped_at = now;
  bool any = false;
  bool have_kv = false;
  double gpu_cache = 0;
  bool have_gpu_cache = false;
  double latest_lora = -std::numeric_limits<double>::infinity();
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    std::string_view labels;
    std::string_view rest = line.substr(name_end);
    if (rest.front() == '{') {
      const size_t close = rest.find('}');
      if (close == std::string_view::npos) continue;
      labels = rest.substr(0, close + 1);
      rest.remove_prefix(close + 1);
    }
    const std::optional<double> value = SampleValue(rest);
    if (!value) continue;
    if (name == "vllm:num_requests_waiting") {
      metrics.waiting += static_cast<int64_t>(std::llround(*value));
      any = true;
    } else if (name == "vllm:num_requests_running") {
      metrics.running += static_cast<int64_t>(std::llround(*value));
      any = true;
    } else if (name == "vllm:kv_cache_usage_perc") {
      metrics.kv_cache_usage = std::max(metrics.kv_cache_usage, *value);
      have_kv = any = true;
    } else if (name == "vllm:gpu_cache_usage_perc") {
      gpu_cache = std::max(gpu_cache, *value);
      have_gpu_cache = any = true;
    } else if (name == "vllm:lora_requests_info") {
      // One series per distinct adapter set; the value is when it was last seen: the latest wins.
      any = true;
      if (*value < latest_lora) continue;
      latest_lora = *value;
      int max_lora = 0;
      const std::string max_text = LabelValue(labels, "max_lora");
      std::from_chars(max_text.data(), max_text.data() + max_text.size(), max_lora);
      metrics.max_lora = max_lora;
      metrics.running_adapters = SplitList(LabelValue(labels, "running_lora_adapters"));
      metrics.waiting_adapters = SplitList(LabelValue(labels, "waiting_lora_adapters"));
    }
  }
  if (!any) return std::nullopt;
  if (!have_kv && have_gpu_cache) metrics.kv_cache_usage = gpu_cache;
  return metrics;
}

std::vector<uint64_t> HashPrompt(std::string_view model, std::string_view prompt, size_t block_size,
                                 size_t max_blocks) {
  std::vector<uint64_t> hashes;
  if (block_size == 0 || prompt.size() < block_size) return hashes;
  const size_t blocks = std::min(prompt.size() / block_size, max_blocks);
  hashes.reserve(blocks);
  // Different models share no cache, so the model seeds the chain. The seed is no block of the
  // prompt: were it one, every endpoint that ever served the model would match it, and the
  // prefix scorer would favour them over idle ones for prompts no one has cached.
  uint64_t previous = Fnv1a(model);
  for (size_t i = 0; i < blocks; ++i) {
    previous = ChainHash(prompt.substr(i * block_size, block_size), previous);
    hashes.push_back(previous);
  }
  return hashes;
}

std::map<std::string, size_t> PrefixIndex::Match(const std::vector<uint64_t>& hashes) const {
  std::map<std::string, size_t> matched;
  // Chained hashes: an endpoint holding block i almost surely held the blocks before it, so the
  // count of consecutive blocks from the start it holds is its matched prefix.
  std::set<std::string> still;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto found = holders_.find(hashes[i]);
    if (found == holders_.end()) break;
    if (i == 0) {
      still = found->second;
    } else {
      std::set<std::string> next;
      for (const std::string& endpoint : still)
        if (found->second.count(endpoint)) next.insert(endpoint);
      still = std::move(next);
    }
    if (still.empty()) break;
    for (const std::string& endpoint : still)
      ++matched[endpoint];
  }
  return matched;
}

void PrefixIndex::Add(const std::vector<uint64_t>& hashes, const std::string& endpoint,
                      size_t capacity) {
  if (hashes.empty() || capacity == 0) return;
  PerEndpoint& mine = endpoints_[endpoint];
  for (uint64_t hash : hashes) {
    const uint64_t now = ++mine.clock;
    auto [it, inserted] = mine.last_use.try_emplace(hash, now);
    if (!inserted) {
      mine.by_use.erase(it->second);
      it->second = now;
    } else {
      holders_[hash].insert(endpoint);
    }
    mine.by_use.emplace(now, hash);
    while (mine.last_use.size() > capacity) {
      const auto oldest = mine.by_use.begin();
      const uint64_t evicted = oldest->second;
      mine.by_use.erase(oldest);
      mine.last_use.erase(evicted);
      auto holder = holders_.find(evicted);
      holder->second.erase(endpoint);
      if (holder->second.empty()) holders_.erase(holder);
    }
  }
}

void PrefixIndex::RetainOnly(const std::set<std::string>& endpoints) {
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    if (endpoints.count(it->first)) {
      ++it;
      continue;
    }
    for (const auto& [hash, use] : it->second.last_use) {
      auto holder = holders_.find(hash);
      holder->second.erase(it->first);
      if (holder->second.empty()) holders_.erase(holder);
    }
    it = endpoints_.erase(it);
  }
}

size_t PrefixIndex::BlocksOf(const std::string& endpoint) const {
  const auto found = endpoints_.find(endpoint);
  return found == endpoints_.end() ? 0 : found->second.last_use.size();
}

Pick ChooseEndpoint(const PickerState& state, const std::vector<EndpointState>& candidates,
                    const PickRequest& request, const PickerConfig& config, TimeMs now,
                    uint64_t random) {
  Pick pick;
  const size_t n = candidates.size();
  if (n <= 1) return pick;
  switch (config.policy) {
    case RoutingPolicy::kRoundRobin:
      pick.index = static_cast<size_t>(state.next_round_robin % n);
      return pick;
    case RoutingPolicy::kLeastOutstanding:
      pick.index = LeastOutstanding(candidates, random);
      return pick;
    case RoutingPolicy::kEndpointPicker:
      break;
  }
  pick.hashes = HashPrompt(request.model, request.prompt, config.block_size, config.max_blocks);
  // Scores compare endpoints by what they reported: one without fresh numbers cannot be compared.
  for (const EndpointState& endpoint : candidates) {
    if (!endpoint.metrics || now - endpoint.metrics->scraped_at > config.stale_metrics_ms) {
      pick.fell_back = true;
      pick.index = LeastOutstanding(candidates, random);
      return pick;
    }
  }
  // Requests sent since the last scrape are not in its numbers yet: what this gateway has in
  // flight beyond what the server reported counts as waiting.
  std::vector<int64_t> queue(n);
  for (size_t i = 0; i < n; ++i) {
    const EndpointMetrics& m = *candidates[i].metrics;
    queue[i] = m.waiting + std::max<int64_t>(0, candidates[i].in_flight - m.running - m.waiting);
  }
  std::vector<size_t> kept(n);
  for (size_t i = 0; i < n; ++i)
    kept[i] = i;
  auto filter = [&](auto keep) {
    std::vector<size_t> next;
    for (size_t i : kept)
      if (keep(i)) next.push_back(i);
    if (!next.empty()) kept = std::move(next);
  };
  filter([&](size_t i) { return queue[i] <= config.queue_threshold; });
  filter(
      [&](size_t i) { return candidates[i].metrics->kv_cache_usage <= config.kv_cache_threshold; });

  const std::map<std::string, size_t> matched = state.prefixes.Match(pick.hashes);
  int64_t min_queue = std::numeric_limits<int64_t>::max();
  int64_t max_queue = std::numeric_limits<int64_t>::min();
  for (size_t i : kept) {
    min_queue = std::min(min_queue, queue[i]);
    max_queue = std::max(max_queue, queue[i]);
  }
  double best = -std::numeric_limits<double>::infinity();
  std::vector<size_t> best_ones;
  for (size_t i : kept) {
    const EndpointState& endpoint = candidates[i];
    const EndpointMetrics& m = *endpoint.metrics;
    double score = 0;
    if (!pick.hashes.empty()) {
      const auto found = matched.find(endpoint.id);
      const size_t blocks = found == matched.end() ? 0 : found->second;
      score += config.prefix_weight * static_cast<double>(blocks) /
               static_cast<double>(pick.hashes.size());
    }
    score += config.queue_weight * (max_queue == min_queue
                                        ? 1.0
                                        : static_cast<double>(max_queue - queue[i]) /
                                              static_cast<double>(max_queue - min_queue));
    score += config.kv_cache_weight * (1.0 - std::clamp(m.kv_cache_usage, 0.0, 1.0));
    if (!request.adapter.empty()) {
      double lora = 0;
      if (m.running_adapters.count(request.adapter))
        lora = 1.0;
      else if (static_cast<int>(m.running_adapters.size() + m.waiting_adapters.size()) < m.max_lora)
        lora = 0.8;
      else if (m.waiting_adapters.count(request.adapter))
        lora = 0.6;
      score += config.lora_weight * lora;
    }
    // Equal within rounding counts as a tie, broken at random.
    if (score > best + 1e-9) {
      best = score;
      best_ones.assign(1, i);
    } else if (score >= best - 1e-9) {
      best_ones.push_back(i);
    }
  }
  pick.index = best_ones[static_cast<size_t>(random % best_ones.size())];
  return pick;
}

void RecordPick(PickerState& state, const Pick& pick, const std::string& endpoint,
                const PickerConfig& config) {
  ++state.next_round_robin;
  state.prefixes.Add(pick.hashes, endpoint, config.lru_capacity_per_endpoint);
}

}  // namespace gpufleet::serving
