// The serving replay: request trace readers (fixtures in data/ and the real traces) and the
// replay of the three policies (sim/serving_sim.h).
#include "sim/serving_sim.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sim/request_traces.h"
#include "sim/trace.h"

namespace gpufleet::sim {
namespace {

const std::string kData = GPUFLEET_TEST_DATA_DIR;
const std::string kTraces = GPUFLEET_TRACES_DIR;
const std::string kGenAi = kTraces + "/alibaba-genai-v2026/lora_request_trace.csv";
const std::string kAzureCode = kTraces + "/azure-llm-2023/AzureLLMInferenceTrace_code.csv";
const std::string kAzureConv = kTraces + "/azure-llm-2023/AzureLLMInferenceTrace_conv.csv";

std::string ErrorOf(const std::function<void()>& read) {
  try {
    read();
  } catch (const TraceError& error) {
    return error.what();
  }
  return "no error";
}

TEST(RequestTraces, GenAiFixture) {
  const RequestTrace trace = ReadAlibabaGenAiRequests(kData + "/genai_small.csv");
  EXPECT_EQ(trace.deployments, (std::vector<std::string>{"M-a", "M-b"}));  // M-c only pending
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_EQ(trace.failed_replayed, 1);
  EXPECT_EQ(trace.unfinished_skipped, 2);
  EXPECT_EQ(trace.start_epoch_s, 1731664800);
  // By arrival, ties in file order; times relative to the first arrival.
  const std::vector<std::tuple<TimeMs, TimeMs, int32_t>> expected = {
      {0, 5500, 1}, {10000, 20000, 0}, {10000, 3000, 0}, {1800000, 10000, 1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(trace.requests[i].arrival_ms, std::get<0>(expected[i])) << i;
    EXPECT_EQ(trace.requests[i].service_ms, std::get<1>(expected[i])) << i;
    EXPECT_EQ(trace.requests[i].deployment, std::get<2>(expected[i])) << i;
  }
}

TEST(RequestTraces, AzureFixtureServiceTimeFromTokens) {
  const RequestTrace trace = ReadAzureLlmRequests(
      kData + "/azure_small.csv",
      LlmServiceModel{.prefill_ms_per_1k_tokens = 100, .decode_ms_per_token = 15});
  EXPECT_EQ(trace.deployments.size(), 1u);
  ASSERT_EQ(trace.requests.size(), 3u);
  EXPECT_EQ(trace.start_epoch_s, 1700158623);
  EXPECT_EQ(trace.requests[0].arrival_ms, 0);  // 03.5: the earliest, though the last row
  EXPECT_EQ(trace.requests[0].service_ms, 0);
  EXPECT_EQ(trace.requests[1].arrival_ms, 479);         // 03.97996
  EXPECT_EQ(trace.requests[1].service_ms, 631);         // 480.8 + 150
  EXPECT_EQ(trace.requests[2].arrival_ms, 531);         // 04.03196
  EXPECT_EQ(trace.requests[2].service_ms, 100 + 1500);  // 1k context, 100 generated
}

TEST(RequestTraces, MalformedRowsAreRefusedWithFileAndLine) {
  const std::string bad = kData + "/genai_bad_rows.csv";
  EXPECT_NE(
      ErrorOf([&] { ReadAlibabaGenAiRequests(bad); }).find("genai_bad_rows.csv:3: gmt_create"),
      std::string::npos);
  const std::string missing = kData + "/genai_missing_column.csv";
  EXPECT_NE(ErrorOf([&] {
              ReadAlibabaGenAiRequests(missing);
            }).find("genai_missing_column.csv:1: missing column 'exec_time_seconds'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              ReadAzureLlmRequests(kData + "/azure_bad_rows.csv", {});
            }).find("azure_bad_rows.csv:3: ContextTokens 'many'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { ReadAzureLlmRequests(kData + "/empty.csv", {}); }).find(":1: empty"),
            std::string::npos);
  // A job trace is not a request trace.
  EXPECT_NE(ErrorOf([&] {
              ReadAzureLlmRequests(kData + "/itp_small.csv", {});
            }).find("missing column 'TIMESTAMP'"),
            std::string::npos);
}

TEST(RequestTraces, SkipInvalidCountsAndKeepsTheRest) {
  const RequestTrace genai = ReadAlibabaGenAiRequests(kData + "/genai_bad_rows.csv", true);
  EXPECT_EQ(genai.requests.size(), 2u);
  EXPECT_EQ(genai.skipped_invalid, 5);
  ASSERT_FALSE(genai.skip_examples.empty());
  EXPECT_NE(genai.skip_examples[1].find(":4: exec_time_seconds '-1'"), std::string::npos);
  const RequestTrace azure = ReadAzureLlmRequests(kData + "/azure_bad_rows.csv", {}, true);
  EXPECT_EQ(azure.requests.size(), 1u);
  EXPECT_EQ(azure.skipped_invalid, 3);
}

TEST(RequestTraces, RealTraces) {
  const RequestTrace genai = ReadAlibabaGenAiRequests(kGenAi);
  EXPECT_EQ(genai.requests.size(), 26790u);  // 26,823 rows less 33 pending or processing
  EXPECT_EQ(genai.unfinished_skipped, 33);
  EXPECT_EQ(genai.failed_replayed, 398);
  EXPECT_EQ(genai.deployments.size(), 86u);
  EXPECT_EQ(ReadAzureLlmRequests(kAzureCode, {}).requests.size(), 8819u);
  EXPECT_EQ(ReadAzureLlmRequests(kAzureConv, {}).requests.size(), 19366u);
}

TEST(RequestTraces, TimestampWithFraction) {
  EXPECT_EQ(ParseUtcTimestampMs("1970-01-01 00:00:01.2509"), 1250);
  EXPECT_EQ(ParseUtcTimestampMs("1970-01-01 00:00:02"), 2000);
  EXPECT_FALSE(ParseUtcTimestampMs("1970-01-01 00:00:02."));
  EXPECT_FALSE(ParseUtcTimestampMs("1970-01-01 00:00:02.5s"));
}

RequestTrace OneDeployment(std::vector<std::pair<TimeMs, TimeMs>> arrivals_and_service) {
  RequestTrace trace;
  trace.deployments = {"d"};
  for (const auto& [arrival, service] : arrivals_and_service)
    trace.requests.push_back({.arrival_ms = arrival, .service_ms = service, .deployment = 0});
  return trace;
}

ServingOptions SimpleOptions() {
  ServingOptions options;
  options.autoscaler.target = 1;
  options.autoscaler.target_utilization = 1.0;
  options.autoscaler.max_replicas = 10;
  options.cold_start_ms = 30000;
  return options;
}

TEST(ServingSim, LatencyIncludesColdStarts) {
  // 0 s: a cold start (30 s) then 5 s of service; 40 s: the replica is warm; 300 s: it went to
  // zero (idle from 35 s: stable window 60 s + grace 30 s) and starts cold again.
  const RequestTrace trace = OneDeployment({{0, 5000}, {40000, 5000}, {300000, 5000}});
  for (ServingPolicy policy : {ServingPolicy::kKpa, ServingPolicy::kTargetTracking}) {
    SCOPED_TRACE(std::string(ServingPolicyName(policy)));
    ServingOptions options = SimpleOptions();
    options.scale_in_cooldown_ms = 60000;
    const ServingPolicyResult result = SimulateServing(trace, policy, options);
    EXPECT_EQ(result.latency.requests, 3);
    EXPECT_DOUBLE_EQ(result.latency.max_s, 35.0);
    EXPECT_DOUBLE_EQ(result.latency.mean_s, 25.0);
    EXPECT_EQ(result.cold_starts, 2);
  }
  const ServingPolicyResult fixed =
      SimulateServing(trace, ServingPolicy::kFixedAtPeak, SimpleOptions());
  EXPECT_DOUBLE_EQ(fixed.latency.max_s, 5.0);
  EXPECT_EQ(fixed.cold_starts, 0);
  EXPECT_EQ(fixed.fixed_replicas, 1);
  EXPECT_NEAR(fixed.gpu_hours, 305.0 / 3600, 1e-9);  // from t0 to the last completion
}

TEST(ServingSim, RequestsBeyondTheReplicasWaitAtTheGateway) {
  ServingOptions options = SimpleOptions();
  options.autoscaler.max_replicas = 1;
  options.cold_start_ms = 0;
  const ServingPolicyResult result =
      SimulateServing(OneDeployment({{0, 10000}, {0, 10000}}), ServingPolicy::kKpa, options);
  EXPECT_DOUBLE_EQ(result.latency.max_s, 20.0);
  EXPECT_DOUBLE_EQ(result.latency.mean_s, 15.0);
  options.replica_concurrency = 2;  // both in one replica at once
  EXPECT_DOUBLE_EQ(
      SimulateServing(OneDeployment({{0, 10000}, {0, 10000}}), ServingPolicy::kKpa, options)
          .latency.max_s,
      10.0);
}

TEST(ServingSim, ScaledGpuHoursCountColdStartsAndGpusPerReplica) {
  ServingOptions options = SimpleOptions();
  options.gpus_per_replica = 2;
  // One replica from the poke at 0 until the last completion (35 s), 2 GPUs.
  const ServingPolicyResult result =
      SimulateServing(OneDeployment({{0, 5000}}), ServingPolicy::kKpa, options);
  EXPECT_NEAR(result.gpu_hours, 2 * 35.0 / 3600, 1e-9);
  EXPECT_EQ(result.max_replicas, 1);
}

TEST(ServingSim, PeakReplicas) {
  const std::vector<Request> requests = {
      {.arrival_ms = 0, .service_ms = 10000},
      {.arrival_ms = 5000, .service_ms = 10000},
      {.arrival_ms = 10000, .service_ms = 10000}};  // the first ends as the third starts
  EXPECT_EQ(PeakReplicas(requests, 1), 2);
  EXPECT_EQ(PeakReplicas(requests, 2), 1);
  EXPECT_EQ(PeakReplicas({}, 1), 1);
}

TEST(ServingSim, InvalidOptionsAreRefused) {
  ServingOptions options = SimpleOptions();
  options.replica_concurrency = 0;
  EXPECT_TRUE(ValidateServingOptions(options));
  EXPECT_THROW(SimulateServing(OneDeployment({{0, 1}}), ServingPolicy::kKpa, options),
               std::invalid_argument);
  options = SimpleOptions();
  options.autoscaler.panic_window_ms = 0;
  EXPECT_TRUE(ValidateServingOptions(options));
}

std::string Json(const RequestTrace& trace, ServingPolicy policy, const ServingOptions& options) {
  ServingReport report;
  report.options = options;
  report.policies.push_back(SimulateServing(trace, policy, options));
  return ToJson(report).dump();
}

TEST(ServingSim, SkippingIdleTicksChangesNothing) {
  ServingOptions options = SimpleOptions();
  const RequestTrace genai = ReadAlibabaGenAiRequests(kData + "/genai_small.csv");
  const RequestTrace azure = ReadAzureLlmRequests(kAzureCode, {});
  for (ServingPolicy policy : {ServingPolicy::kKpa, ServingPolicy::kTargetTracking}) {
    for (const RequestTrace* trace : {&genai, &azure}) {
      ServingOptions every_tick = options;
      every_tick.skip_idle = false;
      EXPECT_EQ(Json(*trace, policy, options), Json(*trace, policy, every_tick))
          << ServingPolicyName(policy);
    }
  }
}

TEST(ServingSim, GenAiTraceThreePolicies) {
  const RequestTrace trace = ReadAlibabaGenAiRequests(kGenAi);
  const ServingOptions options;  // the defaults gpufleet sim --serving uses
  const ServingPolicyResult kpa = SimulateServing(trace, ServingPolicy::kKpa, options);
  const ServingPolicyResult tt = SimulateServing(trace, ServingPolicy::kTargetTracking, options);
  const ServingPolicyResult fixed = SimulateServing(trace, ServingPolicy::kFixedAtPeak, options);
  for (const ServingPolicyResult* result : {&kpa, &tt, &fixed}) {
    SCOPED_TRACE(std::string(ServingPolicyName(result->policy)));
    // Every request is served; none is cut short by a scale-down (the replay throws if a busy
    // replica were removed).
    EXPECT_EQ(result->latency.requests, static_cast<int64_t>(trace.requests.size()));
    EXPECT_EQ(result->deployments.size(), trace.deployments.size());
  }
  // The fixed fleet never cold-starts, holds its replicas all along, and is what the peak needs.
  EXPECT_EQ(fixed.cold_starts, 0);
  EXPECT_EQ(fixed.max_replicas, fixed.fixed_replicas);
  int32_t peak_sum = 0;
  for (const DeploymentOutcome& d : fixed.deployments)
    peak_sum += d.fixed_replicas;
  EXPECT_EQ(fixed.fixed_replicas, peak_sum);
  // Each deployment's replicas run from t0 to the last arrival, or to its last completion.
  const double span_h = static_cast<double>(trace.requests.back().arrival_ms) / 3.6e6;
  EXPECT_GE(fixed.gpu_hours, fixed.fixed_replicas * span_h);
  EXPECT_LE(fixed.gpu_hours, fixed.fixed_replicas * static_cast<double>(fixed.end_ms) / 3.6e6);
  // Scale to zero pays off on a trace that is idle most of the time, at a latency cost.
  EXPECT_LT(kpa.gpu_hours, fixed.gpu_hours / 10);
  EXPECT_GT(kpa.cold_starts, 0);
  EXPECT_GE(kpa.latency.p99_s, fixed.latency.p99_s);
  // Latency never drops below service time: p50 of the fixed fleet is the trace's median.
  EXPECT_GE(kpa.latency.p50_s, fixed.latency.p50_s);
}

TEST(ServingSim, Deterministic) {
  const RequestTrace trace = ReadAzureLlmRequests(kAzureConv, {});
  ServingOptions options;
  options.replica_concurrency = 8;
  options.autoscaler.target = 8;
  for (ServingPolicy policy : AllServingPolicies())
    EXPECT_EQ(Json(trace, policy, options), Json(trace, policy, options));
}

TEST(ServingReportOutput, TableJsonAndSvg) {
  const RequestTrace trace = OneDeployment({{0, 5000}, {40000, 5000}});
  ServingReport report;
  report.trace = "t.csv";
  report.format = "genai";
  report.requests = 2;
  report.deployments = 1;
  report.options = SimpleOptions();
  for (ServingPolicy policy : AllServingPolicies())
    report.policies.push_back(SimulateServing(trace, policy, report.options));
  const std::string table = FormatServingReport(report);
  EXPECT_NE(table.find("\nkpa "), std::string::npos) << table;
  EXPECT_NE(table.find("\ntarget-tracking "), std::string::npos) << table;
  EXPECT_NE(table.find("\nfixed-at-peak (1) "), std::string::npos) << table;
  const nlohmann::json json = ToJson(report);
  ASSERT_EQ(json["policies"].size(), 3u);
  EXPECT_EQ(json["policies"][0]["policy"], "kpa");
  EXPECT_EQ(json["policies"][0]["cold_starts"], 1);
  EXPECT_EQ(json["policies"][2]["deployments"][0]["peak_replicas"], 1);
  const std::string svg = RenderServingSvg(report, "a <title>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;title&gt;"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++lines;
  EXPECT_EQ(lines, 3u);
}

}  // namespace
}  // namespace gpufleet::sim
