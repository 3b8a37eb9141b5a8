#include "serving/picker.h"

#include <random>
#include <set>

#include <gtest/gtest.h>

namespace gpufleet::serving {
namespace {

EndpointState Fresh(std::string id, int64_t waiting, double kv, int64_t in_flight = 0) {
  EndpointState state;
  state.id = std::move(id);
  state.in_flight = in_flight;
  EndpointMetrics metrics;
  metrics.waiting = waiting;
  metrics.kv_cache_usage = kv;
  metrics.scraped_at = 1000;
  state.metrics = metrics;
  return state;
}

PickerConfig Picker() {
  PickerConfig config;
  config.policy = RoutingPolicy::kEndpointPicker;
  config.block_size = 4;
  return config;
}

TEST(Picker, PolicyNames) {
  for (auto policy : {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastOutstanding,
                      RoutingPolicy::kEndpointPicker})
    EXPECT_EQ(ParseRoutingPolicy(RoutingPolicyName(policy)), policy);
  EXPECT_FALSE(ParseRoutingPolicy("random"));
}

TEST(Picker, RoundRobinCycles) {
  PickerState state;
  PickerConfig config;
  config.policy = RoutingPolicy::kRoundRobin;
  std::vector<EndpointState> endpoints = {{"a", 0, {}}, {"b", 0, {}}, {"c", 0, {}}};
  std::vector<size_t> picked;
  for (int i = 0; i < 6; ++i) {
    Pick pick = ChooseEndpoint(state, endpoints, {}, config, 0, 12345);
    picked.push_back(pick.index);
    RecordPick(state, pick, endpoints[pick.index].id, config);
  }
  EXPECT_EQ(picked, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(Picker, LeastOutstandingTakesTheLessBusyOfTwo) {
  PickerState state;
  PickerConfig config;
  config.policy = RoutingPolicy::kLeastOutstanding;
  std::vector<EndpointState> endpoints = {{"a", 5, {}}, {"b", 1, {}}, {"c", 9, {}}};
  std::mt19937_64 random(7);
  int picks_of_c = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t index = ChooseEndpoint(state, endpoints, {}, config, 0, random()).index;
    // The busiest can never win a pair; the idlest wins every pair it is in.
    EXPECT_NE(index, 2u);
    picks_of_c += index == 2;
  }
  // Two endpoints: always the less busy one.
  std::vector<EndpointState> two = {{"a", 3, {}}, {"b", 2, {}}};
  for (uint64_t r = 0; r < 20; ++r)
    EXPECT_EQ(ChooseEndpoint(state, two, {}, config, 0, r * 0x9e3779b97f4a7c15ull).index, 1u);
}

TEST(Picker, StaleMetricsFallBackToLeastOutstanding) {
  PickerState state;
  PickerConfig config = Picker();
  std::vector<EndpointState> endpoints = {Fresh("a", 0, 0.0, 4), Fresh("b", 50, 0.7, 0)};
  // Fresh: the picker prefers a (empty queue, free cache).
  Pick fresh = ChooseEndpoint(state, endpoints, {}, config, 1500, 0);
  EXPECT_FALSE(fresh.fell_back);
  EXPECT_EQ(fresh.index, 0u);
  // Stale by now: least outstanding, which is b.
  Pick stale = ChooseEndpoint(state, endpoints, {}, config, 1000 + config.stale_metrics_ms + 1, 0);
  EXPECT_TRUE(stale.fell_back);
  EXPECT_EQ(stale.index, 1u);
  // Never scraped counts as stale.
  endpoints[0].metrics.reset();
  EXPECT_TRUE(ChooseEndpoint(state, endpoints, {}, config, 1000, 0).fell_back);
}

TEST(Picker, QueueAndKvCacheFiltersAndScores) {
  PickerState state;
  PickerConfig config = Picker();
  // b's queue is over the threshold, c's cache nearly full: a wins although it is not idlest.
  std::vector<EndpointState> endpoints = {Fresh("a", 10, 0.5), Fresh("b", 200, 0.0),
                                          Fresh("c", 0, 0.95)};
  for (uint64_t r = 0; r < 10; ++r)
    EXPECT_EQ(ChooseEndpoint(state, endpoints, {}, config, 1000, r).index, 0u);
  // All over the thresholds: the filters step aside and the scores decide (c: shortest queue).
  std::vector<EndpointState> loaded = {Fresh("a", 300, 0.9), Fresh("b", 200, 0.9),
                                       Fresh("c", 150, 0.9)};
  EXPECT_EQ(ChooseEndpoint(state, loaded, {}, config, 1000, 0).index, 2u);
  // Requests sent since the scrape count as queued: a has 6 in flight, reported none.
  std::vector<EndpointState> inflight = {Fresh("a", 0, 0.1, 6), Fresh("b", 2, 0.1, 0)};
  EXPECT_EQ(ChooseEndpoint(state, inflight, {}, config, 1000, 0).index, 1u);
}

TEST(Picker, PrefixAffinitySendsASharedPrefixBack) {
  PickerState state;
  PickerConfig config = Picker();
  std::vector<EndpointState> endpoints = {Fresh("a", 1, 0.2), Fresh("b", 1, 0.2),
                                          Fresh("c", 1, 0.2)};
  const std::string system = "You are a helpful assistant. Answer briefly. ";
  const std::string first_prompt = system + "What is 2+2?";
  PickRequest first{"llama", "", first_prompt};
  Pick pick = ChooseEndpoint(state, endpoints, first, config, 1000, 2);
  const std::string chosen = endpoints[pick.index].id;
  RecordPick(state, pick, chosen, config);
  // Same prefix, different ending, whatever the random draw: the same endpoint.
  const std::string second_prompt = system + "Name a colour.";
  PickRequest second{"llama", "", second_prompt};
  for (uint64_t r = 0; r < 10; ++r)
    EXPECT_EQ(endpoints[ChooseEndpoint(state, endpoints, second, config, 1000, r).index].id,
              chosen);
  // Another model shares no cache: equal scores, so the random draw spreads it.
  PickRequest other{"qwen", "", second_prompt};
  std::set<size_t> spread;
  for (uint64_t r = 0; r < 30; ++r)
    spread.insert(ChooseEndpoint(state, endpoints, other, config, 1000, r).index);
  EXPECT_EQ(spread.size(), 3u);
}

TEST(Picker, PrefixAffinityYieldsToALongQueue) {
  PickerState state;
  PickerConfig config = Picker();
  std::vector<EndpointState> endpoints = {Fresh("a", 0, 0.2), Fresh("b", 0, 0.2)};
  const std::string prompt(64, 'x');
  PickRequest request{"m", "", prompt};
  Pick pick = ChooseEndpoint(state, endpoints, request, config, 1000, 0);
  RecordPick(state, pick, "a", config);
  endpoints[0].metrics->waiting = 500;  // past the queue filter
  EXPECT_EQ(ChooseEndpoint(state, endpoints, request, config, 1000, 0).index, 1u);
}

TEST(Picker, LoraAffinity) {
  PickerState state;
  PickerConfig config = Picker();
  std::vector<EndpointState> endpoints = {Fresh("a", 0, 0.2), Fresh("b", 0, 0.2),
                                          Fresh("c", 0, 0.2)};
  for (auto& endpoint : endpoints)
    endpoint.metrics->max_lora = 1;
  endpoints[0].metrics->running_adapters = {"other"};  // full, without ours
  endpoints[1].metrics->running_adapters = {"sql"};    // ours is loaded
  endpoints[2].metrics->waiting_adapters = {"other"};  // full too
  PickRequest request{"sql", "sql", "select"};
  for (uint64_t r = 0; r < 10; ++r)
    EXPECT_EQ(ChooseEndpoint(state, endpoints, request, config, 1000, r).index, 1u);
  // Not loaded anywhere: the one with room to load it.
  endpoints[1].metrics->running_adapters.clear();
  for (uint64_t r = 0; r < 10; ++r)
    EXPECT_EQ(ChooseEndpoint(state, endpoints, request, config, 1000, r).index, 1u);
}

TEST(PromptHash, ChainedBlocks) {
  auto a = HashPrompt("m", "aaaabbbbcc", 4, 256);
  ASSERT_EQ(a.size(), 2u);  // two whole blocks; "cc" is left out
  auto b = HashPrompt("m", "aaaabbbbdddd", 4, 256);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  // The same block after a different prefix hashes differently.
  auto c = HashPrompt("m", "zzzzbbbb", 4, 256);
  EXPECT_NE(c[1], a[1]);
  EXPECT_NE(HashPrompt("other", "aaaa", 4, 256)[0], a[0]);
  EXPECT_TRUE(HashPrompt("m", "abc", 4, 256).empty());
  EXPECT_EQ(HashPrompt("m", std::string(100, 'x'), 4, 5).size(), 5u);
}

TEST(PrefixIndexTest, LongestMatchAndLruBound) {
  PrefixIndex index;
  auto hashes = HashPrompt("m", "aaaabbbbccccdddd", 4, 256);  // 4 blocks
  index.Add(hashes, "a", 100);
  auto shorter = HashPrompt("m", "aaaabbbbxxxx", 4, 256);
  index.Add(shorter, "b", 100);
  auto matched = index.Match(hashes);
  EXPECT_EQ(matched["a"], 4u);
  EXPECT_EQ(matched["b"], 2u);  // aaaa + bbbb
  // Capacity 3: the oldest blocks of "c" go first.
  index.Add(hashes, "c", 3);
  EXPECT_EQ(index.BlocksOf("c"), 3u);
  EXPECT_EQ(index.Match(hashes).count("c"), 0u);  // its first blocks were evicted
  index.RetainOnly({"b"});
  EXPECT_EQ(index.Match(hashes).count("a"), 0u);
  EXPECT_EQ(index.Match(hashes)["b"], 2u);
}

// Having served the model before is no prefix match: a prompt that shares no block with what
// an endpoint served gives it no credit, so idle endpoints tie and the draw spreads new prompts
// instead of piling them on the endpoints that served first.
TEST(PrefixIndexTest, AnUnrelatedPromptOfTheSameModelMatchesNothing) {
  PrefixIndex index;
  index.Add(HashPrompt("m", "aaaabbbbcccc", 4, 256), "a", 100);
  EXPECT_TRUE(index.Match(HashPrompt("m", "xxxxyyyyzzzz", 4, 256)).empty());

  PickerState state;
  const PickerConfig config = Picker();
  std::vector<EndpointState> endpoints = {Fresh("a", 0, 0.1), Fresh("b", 0, 0.1)};
  RecordPick(state, ChooseEndpoint(state, endpoints, {"m", "", "aaaabbbbcccc"}, config, 1000, 0),
             "a", config);
  std::set<size_t> picked;
  for (uint64_t r = 0; r < 8; ++r)
    picked.insert(
        ChooseEndpoint(state, endpoints, {"m", "", "xxxxyyyyzzzz"}, config, 1000, r).index);
  EXPECT_EQ(picked, (std::set<size_t>{0, 1}));
  // While a prompt that "a" has served still goes there.
  for (uint64_t r = 0; r < 8; ++r)
    EXPECT_EQ(ChooseEndpoint(state, endpoints, {"m", "", "aaaabbbbcccc"}, config, 1000, r).index,
              0u);
}

TEST(VllmMetrics, Parses) {
  const std::string text = R"(# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 3.0
vllm:num_requests_running{model_name="llama"} 7.0
vllm:kv_cache_usage_perc{model_name="llama"} 0.42
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters="old"} 1.6e9
)";
  auto metrics = ParseVllmMetrics(text, 55);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->waiting, 3);
  EXPECT_EQ(metrics->running, 7);
  EXPECT_DOUBLE_EQ(metrics->kv_cache_usage, 0.42);
  EXPECT_EQ(metrics->max_lora, 4);
  EXPECT_EQ(metrics->running_adapters, (std::set<std::string>{"sql", "chat"}));
  EXPECT_TRUE(metrics->waiting_adapters.empty());
  EXPECT_EQ(metrics->scraped_at, 55);
  auto older = ParseVllmMetrics("vllm:gpu_cache_usage_perc 0.5\n", 0);
  ASSERT_TRUE(older);
  EXPECT_DOUBLE_EQ(older->kv_cache_usage, 0.5);
  EXPECT_FALSE(ParseVllmMetrics("process_cpu_seconds_total 4\n", 0));
  EXPECT_FALSE(ParseVllmMetrics("vllm:num_requests_waiting{ garbage\n", 0));
}

}  // namespace
}  // namespace gpufleet::serving
