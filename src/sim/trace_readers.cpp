#include "sim/trace_readers.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/job.h"
#include "sim/csv.h"

namespace gpufleet::sim {
namespace {

using Fields = std::span<const std::string_view>;

constexpr size_t kMaxSkipExamples = 5;
// Bounds that catch garbage before it overflows: times within 30,000 years, and GPU counts whose
// milli-GPU totals fit MilliGpu (int32).
constexpr double kMaxSeconds = 1e12;
constexpr int64_t kMaxGpusPerJob = 1'000'000;
constexpr int64_t kMaxGpusPerNode = 1024;
constexpr double kMaxCpuCores = 1e9;

constexpr std::array<std::pair<TraceFormat, std::string_view>, 4> kFormatNames = {{
    {TraceFormat::kItp, "itp"},
    {TraceFormat::kPhilly, "philly"},
    {TraceFormat::kAlibabaPods, "alibaba-pods"},
    {TraceFormat::kGeneric, "generic"},
}};

constexpr std::array<std::string_view, 13> kGenericColumns = {
    "submit_time", "duration",  "gpus",
    "id",          "tasks",     "cpu",
    "memory_mib",  "gpu_model", "min_gpu_memory_mib",
    "queue",       "priority",  "estimate",
    "preemptible"};

// A bad data row; the reader prefixes "path:line: ".
class RowError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Column positions by name, from the header line.
class Header {
 public:
  Header(const std::string& path, const CsvRecord& record) : path_(path), line_(record.line) {
    for (const std::string_view field : record.fields) {
      if (field.empty())
        throw TraceError(
            fmt::format("{}:{}: column {} has no name", path, line_, names_.size() + 1));
      if (Find(field))
        throw TraceError(fmt::format("{}:{}: duplicate column '{}'", path, line_, field));
      names_.emplace_back(field);
    }
  }

  std::optional<size_t> Find(std::string_view name) const {
    const auto it = std::find(names_.begin(), names_.end(), name);
    if (it == names_.end()) return std::nullopt;
    return static_cast<size_t>(it - names_.begin());
  }

  size_t Require(std::string_view name) const {
    if (const auto index = Find(name)) return *index;
    throw TraceError(fmt::format("{}:{}: missing column '{}'", path_, line_, name));
  }

  bool HasAll(std::initializer_list<std::string_view> names) const {
    return std::all_of(names.begin(), names.end(), [&](std::string_view n) { return Find(n); });
  }

  const std::vector<std::string>& names() const { return names_; }
  const std::string& path() const { return path_; }
  int64_t line() const { return line_; }

 private:
  std::string path_;
  int64_t line_ = 1;
  std::vector<std::string> names_;
};

Header ReadHeader(const std::string& path, CsvReader& reader) {
  CsvRecord record;
  if (!reader.Next(record))
    throw TraceError(fmt::format("{}:1: empty file: expected a header line", path));
  if (!record.error.empty())
    throw TraceError(fmt::format("{}:{}: {}", path, record.line, record.error));
  return Header(path, record);
}

TraceFormat FormatOf(const Header& header) {
  if (header.HasAll({"job_id", "submission_time", "duration", "num_gpu"})) return TraceFormat::kItp;
  if (header.HasAll({"timestamp", "duration", "num_gpus"})) return TraceFormat::kPhilly;
  if (header.HasAll({"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}))
    return TraceFormat::kAlibabaPods;
  if (header.HasAll({"submit_time", "duration", "gpus"})) return TraceFormat::kGeneric;
  if (header.HasAll({"sn", "gpu", "model"}))
    throw TraceError(fmt::format(
        "{}:{}: this is an Alibaba node list, a cluster description rather than a job trace",
        header.path(), header.line()));
  throw TraceError(fmt::format(
      "{}:{}: unknown trace format, columns '{}' (see docs/trace-formats.md for the formats: {})",
      header.path(), header.line(), fmt::join(header.names(), ","),
      fmt::join(TraceFormatNames(), ", ")));
}

std::string_view NonEmpty(std::string_view text, std::string_view column) {
  if (text.empty()) throw RowError(fmt::format("{} is empty", column));
  return text;
}

double Number(std::string_view text, std::string_view column) {
  if (const auto value = ParseDouble(NonEmpty(text, column))) return *value;
  throw RowError(fmt::format("{} '{}' is not a number", column, text));
}

// Seconds as milliseconds, rounded to the nearest.
TimeMs Seconds(std::string_view text, std::string_view column) {
  const double seconds = Number(text, column);
  if (std::abs(seconds) > kMaxSeconds)
    throw RowError(fmt::format("{} '{}' is out of range", column, text));
  return std::llround(seconds * kMsPerSecond);
}

TimeMs Duration(std::string_view text, std::string_view column) {
  const TimeMs duration = Seconds(text, column);
  if (duration < 0) throw RowError(fmt::format("{} '{}' is negative", column, text));
  return duration;
}

// An integer, also written as a float with no fractional part ("8.0").
int64_t WholeNumber(std::string_view text, std::string_view column, int64_t min, int64_t max) {
  std::optional<int64_t> value = ParseInt(NonEmpty(text, column));
  if (!value) {
    const double number = Number(text, column);
    if (number != std::floor(number))
      throw RowError(fmt::format("{} '{}' is not a whole number", column, text));
    // Clamp what int64 cannot hold so that the range checks below report it.
    constexpr double kInt64Bound = 9e18;
    value = std::abs(number) < kInt64Bound ? static_cast<int64_t>(number)
            : number < 0                   ? std::numeric_limits<int64_t>::min()
                                           : std::numeric_limits<int64_t>::max();
  }
  if (*value < min) {
    if (min == 0) throw RowError(fmt::format("{} '{}' is negative", column, text));
    throw RowError(fmt::format("{} '{}' must be at least {}", column, text, min));
  }
  if (*value > max) throw RowError(fmt::format("{} '{}' must be at most {}", column, text, max));
  return *value;
}

int64_t NonNegative(std::string_view text, std::string_view column) {
  return WholeNumber(text, column, 0, std::numeric_limits<int64_t>::max());
}

// A count of whole GPUs for traces where every job uses GPUs.
int32_t GpuCount(std::string_view text, std::string_view column) {
  return static_cast<int32_t>(WholeNumber(text, column, 1, kMaxGpusPerJob));
}

// A '|'-separated list of GPU models; empty means any model.
std::vector<std::string> ModelList(std::string_view text, std::string_view column) {
  std::vector<std::string> models;
  if (text.empty()) return models;
  while (true) {
    const size_t bar = text.find('|');
    const std::string_view model = TrimSpaces(text.substr(0, bar));
    if (model.empty()) throw RowError(fmt::format("{} '{}' has an empty model name", column, text));
    models.emplace_back(model);
    if (bar == std::string_view::npos) return models;
    text.remove_prefix(bar + 1);
  }
}

bool Boolean(std::string_view text, std::string_view column) {
  const auto equals = [&](std::string_view word) {
    return std::equal(text.begin(), text.end(), word.begin(), word.end(), [](char a, char b) {
      return std::tolower(static_cast<unsigned char>(a)) == b;
    });
  };
  if (text == "1" || equals("true")) return true;
  if (text == "0" || equals("false")) return false;
  throw RowError(fmt::format("{} '{}' is not true, false, 1 or 0", column, text));
}

// job_id,submission_time,duration,num_gpu
class ItpRows {
 public:
  explicit ItpRows(const Header& header)
      : id_(header.Require("job_id")),
        submit_(header.Require("submission_time")),
        duration_(header.Require("duration")),
        gpus_(header.Require("num_gpu")) {}

  TraceJob Build(Fields fields, const ReadOptions& options) const {
    TraceJob job;
    job.trace_id = fields[id_];
    job.spec.submit_time = Seconds(fields[submit_], "submission_time");
    job.duration = Duration(fields[duration_], "duration");
    SetGangShape(job.spec, GpuCount(fields[gpus_], "num_gpu"), options.gpus_per_node);
    return job;
  }

 private:
  size_t id_, submit_, duration_, gpus_;
};

// timestamp,duration,num_gpus,gpu_time,cluster
class PhillyRows {
 public:
  explicit PhillyRows(const Header& header)
      : timestamp_(header.Require("timestamp")),
        duration_(header.Require("duration")),
        gpus_(header.Require("num_gpus")),
        cluster_(header.Find("cluster")) {}

  TraceJob Build(Fields fields, const ReadOptions& options) const {
    TraceJob job;
    const std::string_view timestamp = NonEmpty(fields[timestamp_], "timestamp");
    const auto seconds = ParseUtcTimestamp(timestamp);
    if (!seconds)
      throw RowError(fmt::format("timestamp '{}' is not a date and time like '2017-10-09 07:01:55'",
                                 timestamp));
    job.spec.submit_time = *seconds * kMsPerSecond;
    job.duration = Duration(fields[duration_], "duration");
    SetGangShape(job.spec, GpuCount(fields[gpus_], "num_gpus"), options.gpus_per_node);
    if (cluster_ && !fields[*cluster_].empty()) job.spec.queue = fields[*cluster_];
    return job;
  }

 private:
  size_t timestamp_, duration_, gpus_;
  std::optional<size_t> cluster_;
};

// name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,
// deletion_time,scheduled_time]
class AlibabaPodRows {
 public:
  explicit AlibabaPodRows(const Header& header)
      : name_(header.Require("name")),
        cpu_(header.Require("cpu_milli")),
        memory_(header.Require("memory_mib")),
        gpus_(header.Require("num_gpu")),
        gpu_milli_(header.Require("gpu_milli")),
        gpu_spec_(header.Find("gpu_spec")),
        creation_(header.Find("creation_time")),
        deletion_(header.Find("deletion_time")) {}

  TraceJob Build(Fields fields, const ReadOptions& /*options: a pod is one task*/) const {
    TraceJob job;
    job.trace_id = fields[name_];
    JobSpec& spec = job.spec;
    spec.cpu_milli_per_task = NonNegative(fields[cpu_], "cpu_milli");
    spec.memory_mib_per_task = NonNegative(fields[memory_], "memory_mib");
    spec.gpu_milli_per_task = PodGpuMilli(fields);
    if (gpu_spec_) spec.gpu_models = ModelList(fields[*gpu_spec_], "gpu_spec");

    // Lists without times (the multigpu variants) keep file order at time 0.
    if (creation_ && !fields[*creation_].empty()) {
      spec.submit_time = Seconds(fields[*creation_], "creation_time");
      if (deletion_ && !fields[*deletion_].empty()) {
        job.duration = Seconds(fields[*deletion_], "deletion_time") - spec.submit_time;
        if (job.duration < 0)
          throw RowError(fmt::format("deletion_time '{}' is before creation_time '{}'",
                                     fields[*deletion_], fields[*creation_]));
      }
    }
    return job;
  }

 private:
  // gpu_milli is per GPU: below 1000 it is a share of a single GPU.
  MilliGpu PodGpuMilli(Fields fields) const {
    const int64_t gpus = WholeNumber(fields[gpus_], "num_gpu", 0, kMaxGpusPerJob);
    const int64_t milli = NonNegative(fields[gpu_milli_], "gpu_milli");
    if (gpus == 0) {
      if (milli != 0)
        throw RowError(
            fmt::format("num_gpu 0 with gpu_milli {}: a CPU-only pod has no GPU share", milli));
      return 0;
    }
    if (milli == 0 || milli > kMilliPerGpu)
      throw RowError(
          fmt::format("gpu_milli {} with num_gpu {}: expected 1 to {}", milli, gpus, kMilliPerGpu));
    if (milli == kMilliPerGpu) return static_cast<MilliGpu>(gpus * kMilliPerGpu);
    if (gpus != 1)
      throw RowError(
          fmt::format("gpu_milli {} is a share of one GPU but num_gpu is {}", milli, gpus));
    return static_cast<MilliGpu>(milli);
  }

  size_t name_, cpu_, memory_, gpus_, gpu_milli_;
  std::optional<size_t> gpu_spec_, creation_, deletion_;
};

// submit_time,duration,gpus and the optional columns of kGenericColumns, in any order.
class GenericRows {
 public:
  explicit GenericRows(const Header& header)
      : submit_(header.Require("submit_time")),
        duration_(header.Require("duration")),
        gpus_(header.Require("gpus")),
        id_(header.Find("id")),
        tasks_(header.Find("tasks")),
        cpu_(header.Find("cpu")),
        memory_(header.Find("memory_mib")),
        gpu_model_(header.Find("gpu_model")),
        min_gpu_memory_(header.Find("min_gpu_memory_mib")),
        queue_(header.Find("queue")),
        priority_(header.Find("priority")),
        estimate_(header.Find("estimate")),
        preemptible_(header.Find("preemptible")) {
    std::vector<std::string_view> unknown;
    for (const std::string& name : header.names()) {
      if (std::find(kGenericColumns.begin(), kGenericColumns.end(), name) == kGenericColumns.end())
        unknown.push_back(name);
    }
    if (!unknown.empty())
      throw TraceError(fmt::format("{}:{}: unknown column{} '{}' (known: {})", header.path(),
                                   header.line(), unknown.size() > 1 ? "s" : "",
                                   fmt::join(unknown, "', '"), fmt::join(kGenericColumns, ", ")));
  }

  TraceJob Build(Fields fields, const ReadOptions& options) const {
    TraceJob job;
    JobSpec& spec = job.spec;
    spec.submit_time = Seconds(fields[submit_], "submit_time");
    job.duration = Duration(fields[duration_], "duration");
    SetGpus(fields, options, spec);
    // Optional columns: an empty field keeps the default.
    const auto given = [&](const std::optional<size_t>& column) {
      return column && !fields[*column].empty();
    };
    if (given(id_)) job.trace_id = fields[*id_];
    if (given(cpu_)) {
      const double cores = Number(fields[*cpu_], "cpu");
      if (cores < 0 || cores > kMaxCpuCores)
        throw RowError(
            fmt::format("cpu '{}' is out of range: 0 to {}", fields[*cpu_], kMaxCpuCores));
      spec.cpu_milli_per_task = std::llround(cores * 1000);
    }
    if (given(memory_)) spec.memory_mib_per_task = NonNegative(fields[*memory_], "memory_mib");
    if (given(gpu_model_)) spec.gpu_models = ModelList(fields[*gpu_model_], "gpu_model");
    if (given(min_gpu_memory_))
      spec.min_gpu_memory_mib = NonNegative(fields[*min_gpu_memory_], "min_gpu_memory_mib");
    if (given(queue_)) spec.queue = fields[*queue_];
    if (given(priority_)) {
      spec.priority = static_cast<int32_t>(WholeNumber(fields[*priority_], "priority",
                                                       std::numeric_limits<int32_t>::min(),
                                                       std::numeric_limits<int32_t>::max()));
    }
    if (given(estimate_)) spec.runtime_estimate = Duration(fields[*estimate_], "estimate");
    if (given(preemptible_)) spec.preemptible = Boolean(fields[*preemptible_], "preemptible");
    return job;
  }

 private:
  // gpus is a whole count or a fraction of one GPU; per task when the tasks column is given,
  // otherwise for the whole job, split into a gang that fits the nodes.
  void SetGpus(Fields fields, const ReadOptions& options, JobSpec& spec) const {
    const std::string_view text = fields[gpus_];
    const double gpus = Number(text, "gpus");
    if (gpus < 0) throw RowError(fmt::format("gpus '{}' is negative", text));
    const bool has_tasks = tasks_ && !fields[*tasks_].empty();
    const int64_t tasks = has_tasks ? WholeNumber(fields[*tasks_], "tasks", 1, kMaxGpusPerJob) : 1;
    const int64_t milli = std::llround(gpus * kMilliPerGpu);
    if (gpus > 0 && milli == 0)
      throw RowError(fmt::format("gpus '{}' is less than one milli-GPU", text));
    if (milli < kMilliPerGpu) {
      spec.tasks = static_cast<int32_t>(tasks);
      spec.gpu_milli_per_task = static_cast<MilliGpu>(milli);
      return;
    }
    if (gpus != std::floor(gpus))
      throw RowError(fmt::format("gpus '{}': above one GPU the count must be whole", text));
    if (gpus * static_cast<double>(tasks) > kMaxGpusPerJob)
      throw RowError(
          fmt::format("gpus '{}' is out of range: at most {} per job", text, kMaxGpusPerJob));
    const auto whole = static_cast<int32_t>(gpus);
    if (has_tasks) {
      spec.tasks = static_cast<int32_t>(tasks);
      spec.gpu_milli_per_task = whole * kMilliPerGpu;
    } else {
      SetGangShape(spec, whole, options.gpus_per_node);
    }
  }

  size_t submit_, duration_, gpus_;
  std::optional<size_t> id_, tasks_, cpu_, memory_, gpu_model_, min_gpu_memory_, queue_, priority_,
      estimate_, preemptible_;
};

void CheckOptions(const ReadOptions& options) {
  if (options.gpus_per_node < 1)
    throw std::invalid_argument(
        fmt::format("gpus_per_node must be at least 1, got {}", options.gpus_per_node));
  if (options.limit < 0)
    throw std::invalid_argument(fmt::format("limit must not be negative, got {}", options.limit));
}

bool SubmitsEarlier(const TraceJob& a, const TraceJob& b) {
  return a.spec.submit_time < b.spec.submit_time;
}

// Stable sort by submit time. Sorting small (time, file position) keys and moving each job once is
// several times faster than sorting the large TraceJob objects themselves.
void SortBySubmitTime(std::vector<TraceJob>& jobs) {
  if (std::is_sorted(jobs.begin(), jobs.end(), SubmitsEarlier)) return;
  std::vector<std::pair<TimeMs, size_t>> order;
  order.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    order.emplace_back(jobs[i].spec.submit_time, i);
  std::sort(order.begin(), order.end());
  std::vector<TraceJob> sorted;
  sorted.reserve(jobs.size());
  for (const auto& [time, index] : order)
    sorted.push_back(std::move(jobs[index]));
  jobs = std::move(sorted);
}

// Sorts by submit time, moves the earliest to 0, numbers the jobs and applies the limit.
void Finish(const Header& header, const ReadOptions& options, Trace& trace) {
  if (trace.jobs.empty()) {
    if (trace.skipped == 0)
      throw TraceError(fmt::format("{}:{}: no jobs: the file has a header but no rows",
                                   header.path(), header.line()));
    throw TraceError(fmt::format("{} (and all {} rows are invalid)", trace.skip_examples.front(),
                                 trace.skipped));
  }
  SortBySubmitTime(trace.jobs);
  if (options.limit > 0 && trace.jobs.size() > static_cast<size_t>(options.limit))
    trace.jobs.erase(trace.jobs.begin() + options.limit, trace.jobs.end());
  const TimeMs earliest = trace.jobs.front().spec.submit_time;
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    trace.jobs[i].spec.id = i;
    trace.jobs[i].spec.submit_time -= earliest;
  }
}

template <typename Rows>
Trace ReadRows(const Header& header, CsvReader& reader, size_t expected_rows, const Rows& rows,
               const ReadOptions& options) {
  Trace trace;
  trace.source = header.path();
  trace.jobs.reserve(expected_rows);
  CsvRecord record;
  while (reader.Next(record)) {
    try {
      if (!record.error.empty()) throw RowError(record.error);
      if (record.fields.size() != header.names().size())
        throw RowError(
            fmt::format("expected {} fields, got {}", header.names().size(), record.fields.size()));
      TraceJob job = rows.Build(record.fields, options);
      if (auto why = ValidateJobSpec(job.spec)) throw RowError(std::move(*why));
      job.line = record.line;
      trace.jobs.push_back(std::move(job));
    } catch (const RowError& error) {
      std::string message = fmt::format("{}:{}: {}", header.path(), record.line, error.what());
      if (!options.skip_invalid) throw TraceError(message);
      ++trace.skipped;
      if (trace.skip_examples.size() < kMaxSkipExamples)
        trace.skip_examples.push_back(std::move(message));
    }
  }
  Finish(header, options, trace);
  return trace;
}

Trace ReadTraceText(const std::string& path, std::string_view text,
                    std::optional<TraceFormat> format, const ReadOptions& options) {
  CsvReader reader(text);
  const Header header = ReadHeader(path, reader);
  // One row a line, header included: enough to reserve once.
  const auto rows = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  switch (format ? *format : FormatOf(header)) {
    case TraceFormat::kItp:
      return ReadRows(header, reader, rows, ItpRows(header), options);
    case TraceFormat::kPhilly:
      return ReadRows(header, reader, rows, PhillyRows(header), options);
    case TraceFormat::kAlibabaPods:
      return ReadRows(header, reader, rows, AlibabaPodRows(header), options);
    case TraceFormat::kGeneric:
      return ReadRows(header, reader, rows, GenericRows(header), options);
  }
  throw std::invalid_argument("unknown TraceFormat value");
}

}  // namespace

std::string_view TraceFormatName(TraceFormat format) {
  for (const auto& [value, name] : kFormatNames) {
    if (value == format) return name;
  }
  throw std::invalid_argument("unknown TraceFormat value");
}

std::optional<TraceFormat> ParseTraceFormat(std::string_view name) {
  for (const auto& [value, format_name] : kFormatNames) {
    if (format_name == name) return value;
  }
  return std::nullopt;
}

std::vector<std::string_view> TraceFormatNames() {
  std::vector<std::string_view> names;
  for (const auto& entry : kFormatNames)
    names.push_back(entry.second);
  return names;
}

TraceFormat DetectTraceFormat(const std::string& path) {
  const std::string first_line = ReadFirstLine(path);
  CsvReader reader(first_line);
  return FormatOf(ReadHeader(path, reader));
}

Trace ReadTrace(const std::string& path, TraceFormat format, const ReadOptions& options) {
  CheckOptions(options);
  return ReadTraceText(path, ReadWholeFile(path), format, options);
}

Trace ReadTrace(const std::string& path, const ReadOptions& options) {
  CheckOptions(options);
  return ReadTraceText(path, ReadWholeFile(path), std::nullopt, options);
}

MiB AlibabaGpuMemoryMib(std::string_view model) {
  static constexpr std::array<std::pair<std::string_view, MiB>, 5> kMemory = {{
      {"P100", 16 * 1024},
      {"T4", 16 * 1024},
      {"V100M16", 16 * 1024},
      {"V100M32", 32 * 1024},
      {"A10", 24 * 1024},
  }};
  for (const auto& [name, memory] : kMemory) {
    if (name == model) return memory;
  }
  return 0;
}

Cluster ReadAlibabaNodes(const std::string& path, int32_t nodes_per_rack, int32_t racks_per_spine) {
  if (nodes_per_rack < 1 || racks_per_spine < 1)
    throw std::invalid_argument(
        fmt::format("nodes_per_rack and racks_per_spine must be at least 1, got {} and {}",
                    nodes_per_rack, racks_per_spine));
  const std::string text = ReadWholeFile(path);
  CsvReader reader(text);
  const Header header = ReadHeader(path, reader);
  const size_t sn = header.Require("sn");
  const size_t cpu = header.Require("cpu_milli");
  const size_t memory = header.Require("memory_mib");
  const size_t gpus = header.Require("gpu");
  const size_t model = header.Require("model");

  Cluster cluster;
  std::unordered_map<std::string, int64_t> line_of_name;
  CsvRecord record;
  while (reader.Next(record)) {
    try {
      if (!record.error.empty()) throw RowError(record.error);
      if (record.fields.size() != header.names().size())
        throw RowError(
            fmt::format("expected {} fields, got {}", header.names().size(), record.fields.size()));
      Node node;
      node.name = NonEmpty(record.fields[sn], "sn");
      const auto [first, inserted] = line_of_name.emplace(node.name, record.line);
      if (!inserted)
        throw RowError(
            fmt::format("duplicate node '{}', first on line {}", node.name, first->second));
      node.cpu_milli = NonNegative(record.fields[cpu], "cpu_milli");
      node.memory_mib = NonNegative(record.fields[memory], "memory_mib");
      const int64_t gpu_count = WholeNumber(record.fields[gpus], "gpu", 0, kMaxGpusPerNode);
      const std::string_view gpu_model = record.fields[model];
      if (gpu_count > 0 && gpu_model.empty())
        throw RowError(fmt::format("{} GPUs but no model", gpu_count));
      const auto rack = static_cast<int32_t>(cluster.nodes.size()) / nodes_per_rack;
      node.rack = fmt::format("rack-{:03d}", rack);
      node.spine = fmt::format("spine-{:02d}", rack / racks_per_spine);
      for (int32_t i = 0; i < gpu_count; ++i) {
        node.gpus.push_back(Gpu{.uuid = fmt::format("GPU-{}-{}", node.name, i),
                                .model = std::string(gpu_model),
                                .memory_mib = AlibabaGpuMemoryMib(gpu_model),
                                .index = i,
                                .nvlink_island = 0,
                                .healthy = true});
      }
      cluster.nodes.push_back(std::move(node));
    } catch (const RowError& error) {
      throw TraceError(fmt::format("{}:{}: {}", path, record.line, error.what()));
    }
  }
  if (cluster.nodes.empty())
    throw TraceError(
        fmt::format("{}:{}: no nodes: the file has a header but no rows", path, header.line()));
  return cluster;
}

}  // namespace gpufleet::sim
