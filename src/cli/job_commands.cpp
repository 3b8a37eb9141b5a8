#include "cli/job_commands.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include "api/json.h"
#include "cli/table.h"
#include "core/quantity.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

constexpr std::chrono::milliseconds kLogPollInterval{300};

// ---- YAML job files ---------------------------------------------------------------------------

// Fields whose values are strings whatever they look like: `command: [sleep, 60]` is two words,
// `env: {SEED: 1}` sets SEED to "1", `name: 2024` is a name.
// Deployments' string fields too: the same reader takes `gpufleet deploy -f model.yaml`.
const std::set<std::string, std::less<>> kStringFields = {
    "name",   "queue",          "command", "env",   "workdir", "gpu_model",
    "models", "readiness_path", "routing", "image", "mounts",  "user"};

// A plain (unquoted) scalar as YAML 1.2's core schema reads it.
json PlainScalar(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL")
    return nullptr;
  static const std::regex kInteger("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (std::regex_match(text, kInteger)) {
    int64_t value = 0;
    const char* begin = text.data() + (text.front() == '+' ? 1 : 0);
    auto [end, status] = std::from_chars(begin, text.data() + text.size(), value);
    if (status == std::errc() && end == text.data() + text.size()) return value;
    return text;  // too large for an integer: the API will say what it expected
  }
  if (std::regex_match(text, kFloat)) return std::strtod(text.c_str(), nullptr);
  return text;
}

bool ValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    size_t length = byte < 0x80           ? 1
                    : (byte >> 5) == 0x6  ? 2
                    : (byte >> 4) == 0xe  ? 3
                    : (byte >> 3) == 0x1e ? 4
                                          : 0;
    if (length == 0 || i + length > text.size()) return false;
    uint32_t code = length == 1 ? byte : byte & (0x7f >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff)
      return false;
    i += length;
  }
  return true;
}

// Deeper than any job needs; it stops a self-referring alias (`a: &x [*x]`, found by
// tests/fuzz/fuzz_job_yaml) that would recurse until the stack ends.
constexpr int kMaxYamlDepth = 32;

json YamlToJson(const YAML::Node& node, bool as_string, const std::string& source, int depth = 0) {
  if (depth > kMaxYamlDepth)
    throw YAML::ParserException(
        node.Mark(),
        fmt::format("nested deeper than {} levels (a recursive alias?)", kMaxYamlDepth));
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      // JSON text must be UTF-8; yaml-cpp passes any bytes through (found by fuzz_job_yaml).
      if (!ValidUtf8(node.Scalar()))
        throw YAML::ParserException(node.Mark(), "the value is not valid UTF-8 text");
      // "?" is yaml-cpp's tag for a plain scalar; quoted and !!str ones are strings.
      if (as_string || node.Tag() != "?") return node.Scalar();
      return PlainScalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      json list = json::array();
      for (const YAML::Node& item : node)
        list.push_back(YamlToJson(item, as_string, source, depth + 1));
      return list;
    }
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar() || !ValidUtf8(entry.first.Scalar()))
          throw YAML::ParserException(entry.first.Mark(), "a key must be a plain name");
        object[entry.first.Scalar()] = YamlToJson(entry.second, as_string, source, depth + 1);
      }
      return object;
    }
  }
  return nullptr;
}

// The field an API error is about: "'gpus' must be ..." and "unknown field 'gpu' ..." name it
// first; "'env.SEED'" and "'command[1]'" belong to env and command.
std::string FieldOfError(std::string_view error) {
  constexpr std::string_view kUnknown = "unknown field '";
  size_t start = 0;
  if (error.starts_with(kUnknown))
    start = kUnknown.size();
  else if (error.starts_with("'"))
    start = 1;
  else
    return "";
  size_t end = error.find_first_of("'.[", start);
  if (end == std::string_view::npos) return "";
  return std::string(error.substr(start, end - start));
}

// The number of GPUs as JSON: 1 or 0.5, the way people write it.
json GpusJson(MilliGpu milli) {
  if (milli % kMilliPerGpu == 0) return milli / kMilliPerGpu;
  return static_cast<double>(milli) / kMilliPerGpu;
}

std::optional<JobId> ParseJobId(std::string_view text) {
  JobId id = 0;
  auto [end, status] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (status != std::errc() || end != text.data() + text.size() || id == 0) return std::nullopt;
  return id;
}

// Every id of `ids` as a number; prints why not and returns nothing for one that is not.
std::optional<std::vector<JobId>> ParseJobIds(const std::vector<std::string>& ids) {
  std::vector<JobId> parsed;
  for (const std::string& text : ids) {
    auto id = ParseJobId(text);
    if (!id) {
      Fail(fmt::format("'{}' is not a job id (a number such as 42, as 'gpufleet jobs' lists)",
                       text));
      return std::nullopt;
    }
    parsed.push_back(*id);
  }
  return parsed;
}

// A record from an answer; prints why not (a server that speaks another version).
std::optional<api::JobRecord> RecordOf(const json& body) {
  try {
    return body.get<api::JobRecord>();
  } catch (const std::exception& error) {
    Fail(fmt::format("unexpected job record from the server: {}", error.what()));
  }
  return std::nullopt;
}

std::string JobName(const api::JobRecord& job) {
  if (!job.spec.name.empty()) return job.spec.name;
  if (job.spec.command.empty()) return "-";
  return std::filesystem::path(job.spec.command.front()).filename().string();
}

std::string JoinCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& word : argv) {
    if (!out.empty()) out += ' ';
    // Quoted when a shell would split it, so the line can be pasted back.
    if (word.empty() || word.find_first_of(" \t\n'\"\\$`*?&|;<>()") != std::string::npos) {
      out += '\'';
      for (char c : word)
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += '\'';
    } else {
      out += word;
    }
  }
  return out;
}

std::string TaskGpus(const api::TaskStatus& task) {
  if (task.gpu_indices.empty()) return "-";
  std::string text = fmt::format("{}", fmt::join(task.gpu_indices, ","));
  if (task.gpu_milli > 0 && task.gpu_milli < kMilliPerGpu)
    text += fmt::format(" ({} shared)", api::FormatGpus(task.gpu_milli));
  return text;
}

std::string TaskResult(const api::TaskStatus& task) {
  if (task.signal) return fmt::format("signal {}", *task.signal);
  if (task.exit_code) return fmt::format("{}", *task.exit_code);
  return "-";
}

std::string ShowJob(const api::JobRecord& job, TimeMs now_ms) {
  const api::JobSubmission& spec = job.spec;
  std::string out;
  auto line = [&out](std::string_view key, std::string_view value) {
    out += fmt::format("{:<11}{}\n", key, value);
  };
  line("job", fmt::format("{} {}", job.id, JobName(job)));
  line("user", fmt::format("{} (team {})", job.user, job.team));
  std::string state(api::JobStateName(job.state));
  if (job.attempt > 0) state += fmt::format(" (attempt {})", job.attempt + 1);
  if (job.exit_code && api::IsTerminal(job.state))
    state += fmt::format(", exit code {}", *job.exit_code);
  line("state", state);
  if (!job.reason.empty())
    line(
        job.state == api::JobState::kPending ? "waiting" : "reason",
        job.reason_code.empty() ? job.reason : fmt::format("{} [{}]", job.reason, job.reason_code));
  line("queue", fmt::format("{}, priority {}", spec.queue, spec.priority));
  std::string resources = fmt::format("{} node{} x {}", spec.tasks, spec.tasks == 1 ? "" : "s",
                                      FormatGpuCount(spec.gpu_milli_per_task));
  if (!spec.gpu_models.empty())
    resources += fmt::format(" ({})", fmt::join(spec.gpu_models, " or "));
  if (spec.min_gpu_memory_mib > 0)
    resources += fmt::format(", at least {} GPU memory", FormatMemory(spec.min_gpu_memory_mib));
  if (spec.cpu_milli_per_task > 0)
    resources += fmt::format(", {} CPU", FormatCpu(spec.cpu_milli_per_task));
  if (spec.memory_mib_per_task > 0)
    resources += fmt::format(", {} memory", FormatMemory(spec.memory_mib_per_task));
  line("resources", resources + (spec.tasks > 1 ? " per node" : ""));
  line("command", JoinCommand(spec.command));
  if (!spec.workdir.empty()) line("workdir", spec.workdir);
  if (!spec.container.image.empty()) {
    line("image", spec.container.image);
    for (size_t i = 0; i < spec.container.mounts.size(); ++i)
      line(i == 0 ? "mounts" : "", FormatContainerMount(spec.container.mounts[i]));
    if (!spec.container.user.empty()) line("user", spec.container.user);
  }
  bool first_env = true;
  for (const auto& [name, value] : spec.env) {
    line(first_env ? "env" : "", fmt::format("{}={}", name, value));
    first_env = false;
  }
  std::vector<std::string> options;
  options.push_back(spec.restartable ? "restartable" : "not restartable");
  options.push_back(spec.preemptible ? "preemptible" : "not preemptible");
  if (spec.max_runtime_ms > 0)
    options.push_back(fmt::format("max runtime {}", FormatDuration(spec.max_runtime_ms)));
  options.push_back(fmt::format("grace period {}", FormatDuration(spec.grace_period_ms)));
  if (spec.runtime_estimate_ms)
    options.push_back(fmt::format("estimated {}", FormatDuration(*spec.runtime_estimate_ms)));
  line("options", fmt::format("{}", fmt::join(options, ", ")));
  line("created",
       fmt::format("{} ({} ago)", FormatTime(job.created_ms), FormatAge(job.created_ms, now_ms)));
  if (job.started_ms > 0)
    line("started",
         fmt::format("{} ({} ago)", FormatTime(job.started_ms), FormatAge(job.started_ms, now_ms)));
  if (job.finished_ms > 0) {
    std::string ran;
    if (job.started_ms > 0 && job.finished_ms >= job.started_ms)
      ran =
          fmt::format(", ran {}", FormatDuration((job.finished_ms - job.started_ms) / 1000 * 1000));
    line("finished", fmt::format("{} ({} ago{})", FormatTime(job.finished_ms),
                                 FormatAge(job.finished_ms, now_ms), ran));
  }

  out += "\nTasks:\n";
  if (job.tasks.empty()) {
    out += "  (none placed yet)\n";
  } else {
    Table tasks(
        {{"RANK", 0, true}, {"NODE"}, {"GPUS"}, {"STATE"}, {"EXIT"}, {"WORKLOAD"}, {"ERROR", 60}});
    for (const api::TaskStatus& task : job.tasks)
      tasks.Add({std::to_string(task.rank), task.node.empty() ? "-" : task.node, TaskGpus(task),
                 task.state.empty() ? "-" : task.state, TaskResult(task),
                 task.workload_id.empty() ? "-" : task.workload_id, task.error});
    out += tasks.Render();
  }
  out += "\nEvents:\n";
  if (job.events.empty()) {
    out += "  (none)\n";
  } else {
    Table events({{"TIME"}, {"FROM"}, {"TO"}, {"REASON"}});
    for (const api::JobEvent& event : job.events)
      events.Add({FormatTime(event.time_ms), event.from.empty() ? "-" : event.from, event.to,
                  event.reason});
    out += events.Render();
  }
  return out;
}

// ---- The verbs ----------------------------------------------------------------------------------

int RunSubmit(const JobArgs& args) {
  std::string error;
  auto submission = BuildSubmission(args.submit, error);
  if (!submission) {
    fmt::print(stderr, "error: {}\n", error);
    return kExitUsage;
  }
  if (args.submit.dry_run) {
    // Exactly what would be sent (it passed the API's own parser).
    PrintJson(submission->body);
    return 0;
  }
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  ApiResult answer = client->Post("/jobs", submission->body);
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto record = RecordOf(answer.body);
  if (!record) return kExitFailure;
  fmt::print("job {} submitted: {}\n", record->id, DescribeSubmitted(*record));
  return 0;
}

int RunJobs(const JobArgs& args) {
  std::vector<std::string> query;
  if (!args.state.empty()) {
    if (!api::ParseJobState(args.state)) {
      fmt::print(stderr,
                 "error: --state '{}': expected pending, scheduled, starting, running, "
                 "succeeded, failed or cancelled\n",
                 args.state);
      return kExitUsage;
    }
    query.push_back("state=" + UrlEncode(args.state));
  }
  if (!args.queue.empty()) query.push_back("queue=" + UrlEncode(args.queue));
  if (!args.team.empty()) query.push_back("team=" + UrlEncode(args.team));
  if (!args.user.empty()) query.push_back("user=" + UrlEncode(args.user));
  if (args.limit != 0) {
    if (args.limit < 0) {
      fmt::print(stderr, "error: --limit must be positive\n");
      return kExitUsage;
    }
    query.push_back(fmt::format("limit={}", args.limit));
  }
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  ApiResult answer = client->Get(query.empty() ? std::string("/jobs")
                                               : fmt::format("/jobs?{}", fmt::join(query, "&")));
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  std::vector<api::JobRecord> jobs;
  for (const json& item : ListIn(answer.body, "jobs")) {
    auto record = RecordOf(item);
    if (!record) return kExitFailure;
    jobs.push_back(std::move(*record));
  }
  if (jobs.empty()) {
    fmt::print(stderr, "No jobs found.\n");
    return 0;
  }
  fmt::print("{}", JobsTable(jobs, NowMs()));
  return 0;
}

int RunShow(const JobArgs& args) {
  auto ids = ParseJobIds(args.ids);
  if (!ids) return kExitUsage;
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  int status = 0;
  for (JobId id : *ids) {
    ApiResult answer = client->Get(fmt::format("/jobs/{}", id));
    if (!answer.ok()) {
      status = Fail(answer.message);
      continue;
    }
    if (args.connection.json()) {
      PrintJson(answer.body);
      continue;
    }
    auto record = RecordOf(answer.body);
    if (!record) return kExitFailure;
    if (id != ids->front()) fmt::print("\n");
    fmt::print("{}", ShowJob(*record, NowMs()));
  }
  return status;
}

void WriteRaw(std::string_view bytes) {
  if (bytes.empty()) return;
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  std::fflush(stdout);
}

int RunLogs(const JobArgs& args) {
  auto ids = ParseJobIds(args.ids);
  if (!ids) return kExitUsage;
  if (args.task < 0) {
    fmt::print(stderr, "error: --task must be a rank, 0 or more\n");
    return kExitUsage;
  }
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  const JobId id = ids->front();
  const std::string stream = args.stderr_stream ? "stderr" : "stdout";

  // The attempt whose output is being read: a requeued job starts its logs over.
  auto job_state = [&]() -> std::optional<api::JobRecord> {
    ApiResult answer = client->Get(fmt::format("/jobs/{}", id));
    if (!answer.ok()) {
      Fail(answer.message);
      return std::nullopt;
    }
    return RecordOf(answer.body);
  };
  auto first = job_state();
  if (!first) return kExitFailure;
  int32_t attempt = first->attempt;
  if (args.task >= first->spec.tasks)
    return Fail(fmt::format("job {} has {} task(s): --task is 0 to {}", id, first->spec.tasks,
                            first->spec.tasks - 1));

  uint64_t offset = 0;
  bool warned_unavailable = false;
  int idle_polls = 0;
  bool last_pass = false;  // the job ended: read what is left, then stop
  for (;;) {
    ApiResult answer = client->Call("GET", fmt::format("/jobs/{}/logs?task={}&stream={}&offset={}",
                                                       id, args.task, stream, offset));
    if (!answer.ok()) {
      // A node's agent may be briefly out of reach; following waits for it, a plain read fails.
      if (args.follow && answer.status >= 500) {
        if (!warned_unavailable)
          fmt::print(stderr, "gpufleet: logs unavailable for now ({}); retrying\n", answer.message);
        warned_unavailable = true;
        std::this_thread::sleep_for(kLogPollInterval * 3);
        continue;
      }
      return Fail(answer.message);
    }
    warned_unavailable = false;
    if (const std::string skipped = answer.Header("X-Log-Skipped");
        !skipped.empty() && skipped != "0")
      fmt::print(stderr, "gpufleet: {} bytes of older output were rotated away\n", skipped);
    WriteRaw(answer.text);
    const std::string next = answer.Header("X-Log-Next-Offset");
    uint64_t next_offset = offset + answer.text.size();
    if (!next.empty()) std::from_chars(next.data(), next.data() + next.size(), next_offset);
    const bool progressed = next_offset != offset || !answer.text.empty();
    offset = next_offset;
    const bool finished = answer.Header("X-Log-Finished") == "true";
    if (progressed) {
      idle_polls = 0;
      continue;  // more may be waiting beyond the 1 MiB an answer carries
    }
    if (!args.follow || last_pass) {
      if (offset == 0 && first->state == api::JobState::kPending)
        fmt::print(stderr, "gpufleet: job {} is pending: no output yet (-f waits for it)\n", id);
      return 0;
    }
    // Nothing new: ask about the job when the stream says it ended, and about once a second
    // otherwise (a job cancelled before it ran never gets a finished stream).
    if (finished || ++idle_polls % 3 == 0) {
      auto job = job_state();
      if (!job) return kExitFailure;
      if (api::IsTerminal(job->state)) {
        if (finished) return 0;
        last_pass = true;
        continue;
      }
      if (job->attempt != attempt) {
        fmt::print(stderr, "gpufleet: job {} was requeued: following attempt {}\n", id,
                   job->attempt + 1);
        attempt = job->attempt;
        offset = 0;
        continue;
      }
    }
    std::this_thread::sleep_for(kLogPollInterval);
  }
}

int RunCancel(const JobArgs& args) {
  auto ids = ParseJobIds(args.ids);
  if (!ids) return kExitUsage;
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  int status = 0;
  json records = json::array();
  for (JobId id : *ids) {
    ApiResult answer = client->Call("POST", fmt::format("/jobs/{}/cancel", id));
    if (!answer.ok()) {
      status = Fail(answer.message);
      continue;
    }
    if (args.connection.json()) {
      records.push_back(answer.body);
      continue;
    }
    auto record = RecordOf(answer.body);
    if (!record) return kExitFailure;
    fmt::print("job {} {}\n", id, api::JobStateName(record->state));
  }
  // One id: its record, as the API answers; several: the list of those cancelled.
  if (args.connection.json() && !records.empty())
    PrintJson(ids->size() == 1 ? records[0] : records);
  return status;
}

}  // namespace

std::optional<json> JobYamlToJson(std::string_view text, std::string_view source,
                                  std::string& error, std::map<std::string, int>* lines) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
    if (root.IsNull() || !root.IsDefined()) {
      error = fmt::format(
          "{}: the file is empty; it must be a mapping such as 'command: [python3, "
          "train.py]'",
          source);
      return std::nullopt;
    }
    if (!root.IsMap()) {
      error = fmt::format("{}:{}: the file must be a mapping of fields (name, command, gpus, ...)",
                          source, root.Mark().line + 1);
      return std::nullopt;
    }
    json job = json::object();
    for (const auto& entry : root) {
      if (!entry.first.IsScalar() || !ValidUtf8(entry.first.Scalar())) {
        error = fmt::format("{}:{}: a field name must be a plain word", source,
                            entry.first.Mark().line + 1);
        return std::nullopt;
      }
      const std::string& key = entry.first.Scalar();
      job[key] = YamlToJson(entry.second, kStringFields.count(key) > 0, std::string(source));
      if (lines) (*lines)[key] = entry.first.Mark().line + 1;
    }
    return job;
  } catch (const YAML::Exception& yaml_error) {
    error = fmt::format("{}:{}:{}: {}", source, yaml_error.mark.line + 1,
                        yaml_error.mark.column + 1, yaml_error.msg);
  }
  return std::nullopt;
}

std::optional<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                         std::string& error) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream in(path);
  if (!in) {
    error = fmt::format("cannot read {} '{}': {}", what, path,
                        std::filesystem::exists(path) ? "permission denied" : "no such file");
    return std::nullopt;
  }
  text << in.rdbuf();
  return text.str();
}

std::optional<std::map<std::string, std::string>> ParseEnvFlags(
    const std::vector<std::string>& entries, std::string& error) {
  std::map<std::string, std::string> env;
  for (const std::string& entry : entries) {
    const size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0) {
      error = fmt::format("--env '{}': expected NAME=VALUE", entry);
      return std::nullopt;
    }
    env[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  return env;
}

std::optional<Submission> BuildSubmission(const SubmitArgs& args, std::string& error) {
  json body = json::object();
  std::map<std::string, int> lines;
  const std::string source = args.file == "-" ? "<stdin>" : args.file;
  if (!args.file.empty()) {
    auto text = ReadInputFile(args.file, "job file", error);
    if (!text) return std::nullopt;
    auto parsed = JobYamlToJson(*text, source, error, &lines);
    if (!parsed) return std::nullopt;
    body = std::move(*parsed);
  }
  std::map<std::string, std::string> flag_of;  // field -> the flag that set it
  auto set = [&](const char* field, json value, const char* flag) {
    body[field] = std::move(value);
    flag_of[field] = flag;
  };
  // Quantities are checked here so a bad one is reported against its flag.
  auto quantity = [&](const std::optional<std::string>& value, const char* field, const char* flag,
                      auto parse, std::string_view example) {
    if (!value) return true;
    if (!parse(*value)) {
      error = fmt::format("{} '{}': expected {}", flag, *value, example);
      return false;
    }
    set(field, *value, flag);
    return true;
  };
  if (args.gpus) {
    auto milli = ParseGpuMilli(*args.gpus);
    if (!milli) {
      error = fmt::format("--gpus '{}': expected GPUs per node such as 1, 8 or 0.5", *args.gpus);
      return std::nullopt;
    }
    set("gpus", GpusJson(*milli), "--gpus");
  }
  // --nodes N asks for N distinct nodes, --tasks-per-node (default 1) tasks on each.
  if (args.nodes) {
    if (*args.nodes < 1) {
      error = fmt::format("--nodes {}: a job needs at least 1 node", *args.nodes);
      return std::nullopt;
    }
    set("nodes", *args.nodes, "--nodes");
    body.erase("tasks");  // the flag wins over a job file's count
  }
  if (args.tasks_per_node) {
    if (*args.tasks_per_node < 1) {
      error = fmt::format("--tasks-per-node {}: at least 1", *args.tasks_per_node);
      return std::nullopt;
    }
    set("tasks_per_node", *args.tasks_per_node, "--tasks-per-node");
  }
  if (!args.gpu_models.empty()) set("gpu_model", args.gpu_models, "--gpu-model");
  if (args.queue) set("queue", *args.queue, "--queue");
  if (args.priority) set("priority", *args.priority, "--priority");
  if (args.name) set("name", *args.name, "--name");
  if (!quantity(args.cpu, "cpu", "--cpu", ParseCpuMilli, "cores such as 4, 0.5 or 500m") ||
      !quantity(args.memory, "memory", "--memory", ParseMemoryMib,
                "a size such as 16Gi or 512Mi") ||
      !quantity(args.min_gpu_memory, "min_gpu_memory", "--min-gpu-memory", ParseMemoryMib,
                "a size such as 40Gi") ||
      !quantity(args.max_runtime, "max_runtime", "--max-runtime", ParseDurationMs,
                "a duration such as 2h, 30m or 90s") ||
      !quantity(args.grace_period, "grace_period", "--grace-period", ParseDurationMs,
                "a duration such as 2m or 30s") ||
      !quantity(args.runtime_estimate, "runtime_estimate", "--runtime-estimate", ParseDurationMs,
                "a duration such as 2h, 30m or 90s"))
    return std::nullopt;
  if (!args.env.empty()) {
    auto env = ParseEnvFlags(args.env, error);
    if (!env) return std::nullopt;
    json merged = body.contains("env") && body["env"].is_object() ? body["env"] : json::object();
    for (const auto& [name, value] : *env)
      merged[name] = value;
    set("env", merged, "--env");
  }
  if (args.image) set("image", *args.image, "--image");
  if (!args.mounts.empty()) {
    json mounts = json::array();
    for (const std::string& text : args.mounts) {
      if (!ParseContainerMount(text, error)) {
        error = "--mount " + error;
        return std::nullopt;
      }
      mounts.push_back(text);
    }
    set("mounts", mounts, "--mount");
  }
  if (args.user) set("user", *args.user, "--user");
  const bool in_container = body.contains("image");
  if (args.workdir && in_container && (args.workdir->empty() || args.workdir->front() != '/')) {
    error = fmt::format(
        "--workdir '{}': with an image it is a path inside the container; give it absolute",
        *args.workdir);
    return std::nullopt;
  }
  if (args.workdir && in_container) {
    set("workdir", *args.workdir, "--workdir");
  } else if (args.workdir) {
    // Relative to where the command was typed, as with a shell (the API wants it absolute).
    std::error_code fs_error;
    std::string dir =
        std::filesystem::absolute(*args.workdir, fs_error).lexically_normal().string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    set("workdir", dir, "--workdir");
  }
  if (args.no_restart) set("restartable", false, "--no-restart");
  if (args.not_preemptible) set("preemptible", false, "--not-preemptible");
  if (!args.command.empty()) set("command", args.command, "the command after --");

  const auto command = body.find("command");
  if (command == body.end() || (command->is_array() && command->empty())) {
    error = args.file.empty()
                ? "no command: gpufleet submit [flags] -- COMMAND ARGS... (or -f job.yaml)"
                : fmt::format("{}: no 'command' in the job file, and none after --", source);
    return std::nullopt;
  }

  std::string api_error;
  auto job = api::ParseJobSubmission(body, api_error);
  if (!job) {
    const std::string field = FieldOfError(api_error);
    if (auto flag = flag_of.find(field); flag != flag_of.end())
      error = fmt::format("{}: {}", flag->second, api_error);
    else if (auto line = lines.find(field); line != lines.end())
      error = fmt::format("{}:{}: {}", source, line->second, api_error);
    else if (!args.file.empty())
      error = fmt::format("{}: {}", source, api_error);
    else
      error = api_error;
    return std::nullopt;
  }
  return Submission{std::move(body), std::move(*job)};
}

std::string DescribeSubmitted(const api::JobRecord& record) {
  return fmt::format("{} (queue {}, {} x {})", api::JobStateName(record.state), record.spec.queue,
                     record.spec.tasks, FormatGpuCount(record.spec.gpu_milli_per_task));
}

std::string JobsTable(const std::vector<api::JobRecord>& jobs, TimeMs now_ms) {
  Table table({{"ID", 0, true},
               {"NAME", 24},
               {"USER", 16},
               {"TEAM", 16},
               {"QUEUE", 16},
               {"STATE"},
               {"GPUS", 0, true},
               {"NODES", 0, true},
               {"AGE"},
               {"REASON", 60}});
  for (const api::JobRecord& job : jobs) {
    // The reason says why a job waits or why it failed; for the others it is noise.
    const bool show_reason =
        job.state == api::JobState::kPending || job.state == api::JobState::kFailed;
    table.Add({std::to_string(job.id), JobName(job), job.user.empty() ? "-" : job.user,
               job.team.empty() ? "-" : job.team, job.spec.queue,
               std::string(api::JobStateName(job.state)),
               api::FormatGpus(job.spec.gpu_milli_per_task), std::to_string(job.spec.tasks),
               FormatAge(job.created_ms, now_ms), show_reason ? job.reason : ""});
  }
  return table.Render();
}

void AddJobCommands(CLI::App& app, JobArgs& args) {
  SubmitArgs& submit = args.submit;
  CLI::App* command = app.add_subcommand(
      "submit", "Submit a job: gpufleet submit [flags] -- COMMAND ARGS..., or -f job.yaml");
  args.submit_command = command;
  command->add_option("-f,--file", submit.file,
                      "Job file (YAML or JSON, the API's fields; '-' reads stdin); flags override "
                      "its fields");
  auto optional_string = [&](const char* flag, std::optional<std::string>& field,
                             const char* help) {
    command->add_option_function<std::string>(
        flag, [&field](const std::string& value) { field = value; }, help);
  };
  auto optional_int = [&](const char* flag, std::optional<int32_t>& field, const char* help) {
    command->add_option_function<int32_t>(
        flag, [&field](const int32_t& value) { field = value; }, help);
  };
  optional_string("--gpus", submit.gpus, "GPUs per node (per task); 0.5 shares a GPU [1]");
  optional_int("--nodes", submit.nodes,
               "Distinct nodes, started together as a gang (--tasks-per-node tasks on each) [1]");
  optional_int("--tasks-per-node", submit.tasks_per_node,
               "Tasks on each node, each with its own --gpus (torchrun's --nproc-per-node) [1]");
  command
      ->add_option("--gpu-model", submit.gpu_models,
                   "GPU model to run on, e.g. H100-80GB (repeat to accept several)")
      ->allow_extra_args(false);
  optional_string("--queue", submit.queue, "Queue [default]");
  optional_int("--priority", submit.priority, "Priority within the queue; higher first [0]");
  optional_string("--name", submit.name, "Job name [the command's first word]");
  optional_string("--cpu", submit.cpu, "CPU cores per node: 4, 0.5 or 500m");
  optional_string("--memory", submit.memory, "Memory per node: 16Gi, 512Mi");
  optional_string("--min-gpu-memory", submit.min_gpu_memory, "Only GPUs with this much memory");
  command->add_option("--env", submit.env, "NAME=VALUE in the job's environment (repeatable)")
      ->allow_extra_args(false);  // one value per --env, so the command cannot be swallowed
  optional_string("--workdir", submit.workdir,
                  "Directory to run in on the nodes, or in the container with --image [a fresh "
                  "one per task]");
  optional_string("--image", submit.image,
                  "Run each task in a container from this image: a reference "
                  "(localhost/train:1) or a local image archive's absolute path");
  command
      ->add_option("--mount", submit.mounts,
                   "SOURCE:TARGET[:ro|rw] node directory shown in the container, read-only "
                   "unless :rw (repeatable)")
      ->allow_extra_args(false);
  optional_string("--user", submit.user, "UID[:GID] to run as inside the container");
  optional_string("--max-runtime", submit.max_runtime, "Stop the job after this long: 2h, 30m");
  optional_string("--grace-period", submit.grace_period,
                  "On cancel or preemption, time between SIGTERM and SIGKILL to checkpoint "
                  "(default 30s)");
  optional_string("--runtime-estimate", submit.runtime_estimate,
                  "How long it should run (used by the sjf policy): 30m");
  command->add_flag("--no-restart", submit.no_restart,
                    "Fail the job when its node is lost instead of requeueing it");
  command->add_flag("--not-preemptible", submit.not_preemptible,
                    "Higher-priority jobs may not preempt this one");
  command->add_flag("--dry-run", submit.dry_run,
                    "Check the job and print it as it would be sent; submit nothing");
  command->add_option("command", submit.command, "The command and its arguments, after --");
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand("jobs", "List jobs, newest first (your team's; admins see all)");
  args.jobs_command = command;
  command->add_option("--state", args.state,
                      "Only jobs in this state: pending, running, failed, ...");
  command->add_option("--queue", args.queue, "Only jobs of this queue");
  command->add_option("--team", args.team, "Only jobs of this team (admins)");
  command->add_option("--user", args.user, "Only jobs of this user");
  command->add_option("--limit", args.limit, "At most this many jobs [server default: 100]");
  AddConnectionOptions(*command, args.connection);

  args.job_command = app.add_subcommand("job", "Inspect one job: gpufleet job show ID");
  args.job_command->require_subcommand(1);
  command = args.job_command->add_subcommand(
      "show", "A job's spec, state, why it waits, its tasks and its event history");
  args.show_command = command;
  command->add_option("id", args.ids, "Job id(s)")->required();
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand("logs", "Print a job task's output (-f follows it to the end)");
  args.logs_command = command;
  command->add_option("id", args.ids, "Job id")->required()->expected(1);
  command->add_flag("-f,--follow", args.follow, "Keep printing new output until the job ends");
  command->add_option("--task", args.task, "Task rank (node of the gang)")->capture_default_str();
  command->add_flag("--stderr", args.stderr_stream, "Print stderr instead of stdout");
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand("cancel", "Cancel jobs");
  args.cancel_command = command;
  command->add_option("id", args.ids, "Job id(s)")->required();
  AddConnectionOptions(*command, args.connection);
}

std::optional<int> RunJobCommands(const JobArgs& args) {
  if (*args.submit_command) return RunSubmit(args);
  if (*args.jobs_command) return RunJobs(args);
  if (*args.show_command) return RunShow(args);
  if (*args.logs_command) return RunLogs(args);
  if (*args.cancel_command) return RunCancel(args);
  return std::nullopt;
}

}  // namespace gpufleet::cli
