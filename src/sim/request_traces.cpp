#include "sim/request_traces.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sim/csv.h"
#include "sim/trace.h"

namespace gpufleet::sim {
namespace {

constexpr size_t kMaxSkipExamples = 5;
constexpr double kMaxServiceSeconds = 86400.0 * 365;  // catches garbage before it overflows
constexpr double kMaxTokens = 1e9;

class RowError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Columns {
  std::vector<std::string> names;
  size_t Require(const std::string& path, std::string_view name) const {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end())
      throw TraceError(
          fmt::format("{}:1: missing column '{}' (header: {})", path, name, fmt::join(names, ",")));
    return static_cast<size_t>(it - names.begin());
  }
};

// Reads the file, hands every data row to `row` (which throws RowError for a bad one) and keeps
// the skipped rows' count and first examples.
void ForEachRow(const std::string& path, bool skip_invalid, RequestTrace& trace,
                const std::function<void(const Columns&)>& header,
                const std::function<void(const CsvRecord&)>& row) {
  const std::string text = ReadWholeFile(path);
  CsvReader reader(text);
  CsvRecord record;
  if (!reader.Next(record))
    throw TraceError(fmt::format("{}:1: empty file: expected a header line", path));
  Columns columns;
  for (std::string_view name : record.fields)
    columns.names.emplace_back(name);
  header(columns);
  const size_t width = columns.names.size();
  while (reader.Next(record)) {
    try {
      if (!record.error.empty()) throw RowError(record.error);
      if (record.fields.size() != width)
        throw RowError(fmt::format("expected {} fields, found {}", width, record.fields.size()));
      row(record);
    } catch (const RowError& error) {
      const std::string message = fmt::format("{}:{}: {}", path, record.line, error.what());
      if (!skip_invalid) throw TraceError(message);
      ++trace.skipped_invalid;
      if (trace.skip_examples.size() < kMaxSkipExamples) trace.skip_examples.push_back(message);
    }
  }
}

int64_t ArrivalMs(std::string_view field, std::string_view column) {
  const auto ms = ParseUtcTimestampMs(TrimSpaces(field));
  if (!ms)
    throw RowError(
        fmt::format("{} '{}' is not a date and time (YYYY-MM-DD HH:MM:SS)", column, field));
  return *ms;
}

// Sorts by arrival (stable: ties keep file order) and makes times relative to the first.
void Finish(RequestTrace& trace, std::vector<std::pair<int64_t, Request>>& rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const int64_t start_ms = rows.empty() ? 0 : rows.front().first;
  trace.start_epoch_s = start_ms / kMsPerSecond;
  trace.requests.reserve(rows.size());
  for (auto& [epoch_ms, request] : rows) {
    request.arrival_ms = epoch_ms - start_ms;
    trace.requests.push_back(request);
  }
}

}  // namespace

std::optional<RequestFormat> ParseRequestFormat(std::string_view name) {
  if (name == "genai") return RequestFormat::kAlibabaGenAi;
  if (name == "azure") return RequestFormat::kAzureLlm;
  return std::nullopt;
}

std::string_view RequestFormatName(RequestFormat format) {
  return format == RequestFormat::kAlibabaGenAi ? "genai" : "azure";
}

std::vector<std::string> RequestFormatNames() {
  return {"genai", "azure"};
}

std::optional<int64_t> ParseUtcTimestampMs(std::string_view text) {
  std::string_view seconds_part = text;
  int64_t fraction_ms = 0;
  if (const size_t dot = text.find('.'); dot != std::string_view::npos) {
    seconds_part = text.substr(0, dot);
    const std::string_view fraction = text.substr(dot + 1);
    if (fraction.empty()) return std::nullopt;
    int64_t scale = 100;
    for (const char c : fraction) {
      if (c < '0' || c > '9') return std::nullopt;
      fraction_ms += (c - '0') * scale;
      scale /= 10;
    }
  }
  const auto seconds = ParseUtcTimestamp(seconds_part);
  if (!seconds) return std::nullopt;
  return *seconds * kMsPerSecond + fraction_ms;
}

RequestTrace ReadAlibabaGenAiRequests(const std::string& path, bool skip_invalid) {
  RequestTrace trace;
  trace.source = path;
  size_t created = 0, status = 0, exec = 0, model = 0;
  std::map<std::string, int32_t, std::less<>> deployment_index;
  std::vector<std::pair<int64_t, Request>> rows;
  ForEachRow(
      path, skip_invalid, trace,
      [&](const Columns& columns) {
        created = columns.Require(path, "gmt_create");
        status = columns.Require(path, "predict_status");
        exec = columns.Require(path, "exec_time_seconds");
        model = columns.Require(path, "checkpoint_model_version_id");
      },
      [&](const CsvRecord& record) {
        const std::string_view state = TrimSpaces(record.fields[status]);
        if (state == "PENDING" || state == "PROCESSING") {
          ++trace.unfinished_skipped;
          return;
        }
        if (state != "SUCCEED" && state != "FAILED")
          throw RowError(fmt::format(
              "predict_status '{}' is none of SUCCEED, FAILED, PENDING, PROCESSING", state));
        const int64_t arrival = ArrivalMs(record.fields[created], "gmt_create");
        const auto seconds = ParseDouble(record.fields[exec]);
        if (!seconds || *seconds < 0 || *seconds > kMaxServiceSeconds)
          throw RowError(fmt::format("exec_time_seconds '{}' is not a number of seconds",
                                     record.fields[exec]));
        const std::string_view name = TrimSpaces(record.fields[model]);
        if (name.empty()) throw RowError("checkpoint_model_version_id is empty");
        auto it = deployment_index.find(name);
        if (it == deployment_index.end()) {
          it = deployment_index
                   .emplace(std::string(name), static_cast<int32_t>(trace.deployments.size()))
                   .first;
          trace.deployments.emplace_back(name);
        }
        if (state == "FAILED") ++trace.failed_replayed;
        rows.emplace_back(arrival, Request{.arrival_ms = 0,
                                           .service_ms = std::llround(*seconds * kMsPerSecond),
                                           .deployment = it->second});
      });
  Finish(trace, rows);
  return trace;
}

RequestTrace ReadAzureLlmRequests(const std::string& path, const LlmServiceModel& model,
                                  bool skip_invalid) {
  if (!(model.prefill_ms_per_1k_tokens >= 0) || !(model.decode_ms_per_token >= 0) ||
      !std::isfinite(model.prefill_ms_per_1k_tokens) || !std::isfinite(model.decode_ms_per_token))
    throw std::invalid_argument("the prefill and decode times must be non-negative numbers");
  RequestTrace trace;
  trace.source = path;
  trace.deployments = {"llm"};
  size_t stamp = 0, context = 0, generated = 0;
  std::vector<std::pair<int64_t, Request>> rows;
  ForEachRow(
      path, skip_invalid, trace,
      [&](const Columns& columns) {
        stamp = columns.Require(path, "TIMESTAMP");
        context = columns.Require(path, "ContextTokens");
        generated = columns.Require(path, "GeneratedTokens");
      },
      [&](const CsvRecord& record) {
        const int64_t arrival = ArrivalMs(record.fields[stamp], "TIMESTAMP");
        const auto in = ParseInt(record.fields[context]);
        const auto out = ParseInt(record.fields[generated]);
        if (!in || *in < 0 || *in > kMaxTokens)
          throw RowError(
              fmt::format("ContextTokens '{}' is not a token count", record.fields[context]));
        if (!out || *out < 0 || *out > kMaxTokens)
          throw RowError(
              fmt::format("GeneratedTokens '{}' is not a token count", record.fields[generated]));
        const double service_ms =
            model.prefill_ms_per_1k_tokens * static_cast<double>(*in) / 1000.0 +
            model.decode_ms_per_token * static_cast<double>(*out);
        rows.emplace_back(
            arrival,
            Request{.arrival_ms = 0, .service_ms = std::llround(service_ms), .deployment = 0});
      });
  Finish(trace, rows);
  return trace;
}

RequestTrace ReadRequestTrace(const std::string& path, RequestFormat format,
                              const LlmServiceModel& model, bool skip_invalid) {
  return format == RequestFormat::kAlibabaGenAi ? ReadAlibabaGenAiRequests(path, skip_invalid)
                                                : ReadAzureLlmRequests(path, model, skip_invalid);
}

}  // namespace gpufleet::sim
