#pragma once

// Readers for inference request traces, the input of the serving replay (`gpufleet sim
// --serving`, docs/sim.md): every request's arrival, its service time on one replica, and the
// deployment it is for.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::sim {

enum class RequestFormat {
  kAlibabaGenAi,  // alibaba-genai-v2026/lora_request_trace.csv
  kAzureLlm,      // azure-llm-2023/AzureLLMInferenceTrace_{code,conv}.csv
};

std::optional<RequestFormat> ParseRequestFormat(std::string_view name);  // genai | azure
std::string_view RequestFormatName(RequestFormat format);
std::vector<std::string> RequestFormatNames();

struct Request {
  TimeMs arrival_ms = 0;   // since the trace's first arrival
  TimeMs service_ms = 0;   // time on a replica once it has a slot
  int32_t deployment = 0;  // index into RequestTrace::deployments
};

struct RequestTrace {
  std::string source;
  std::vector<std::string> deployments;  // names; one per model version (GenAI), or one (Azure)
  std::vector<Request> requests;         // by arrival, ties in file order
  int64_t start_epoch_s = 0;             // UTC time of the first arrival
  // GenAI rows whose request failed but ran for its exec time: replayed (the replica was busy).
  int64_t failed_replayed = 0;
  // GenAI rows still PENDING or PROCESSING when the trace was cut: no service time, not replayed.
  int64_t unfinished_skipped = 0;
  int64_t skipped_invalid = 0;             // malformed rows skipped under skip_invalid
  std::vector<std::string> skip_examples;  // the first few, "file:line: why"
};

// How an LLM request's service time follows from its tokens (Azure traces carry no timing):
// service = prefill_ms_per_1k_tokens * ContextTokens / 1000 + decode_ms_per_token *
// GeneratedTokens. The defaults are the order of vLLM's published figures for a 7B model on
// one A100/H100 (prefill about 10k tokens/s, 15 ms per output token at small batch sizes).
struct LlmServiceModel {
  double prefill_ms_per_1k_tokens = 100;
  double decode_ms_per_token = 15;
};

// Throw TraceError ("path:line: why") on a missing column or a malformed row, unless
// skip_invalid, which skips and counts malformed rows instead.
RequestTrace ReadAlibabaGenAiRequests(const std::string& path, bool skip_invalid = false);
RequestTrace ReadAzureLlmRequests(const std::string& path, const LlmServiceModel& model,
                                  bool skip_invalid = false);
RequestTrace ReadRequestTrace(const std::string& path, RequestFormat format,
                              const LlmServiceModel& model, bool skip_invalid = false);

// Parses "YYYY-MM-DD HH:MM:SS[.fraction]" as UTC milliseconds since the epoch (fraction digits
// beyond milliseconds are dropped), or nothing.
std::optional<int64_t> ParseUtcTimestampMs(std::string_view text);

}  // namespace gpufleet::sim
