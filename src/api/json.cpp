#include "api/json.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/job.h"
#include "core/quantity.h"

namespace gpufleet::api {
namespace {

using nlohmann::json;

// Thrown inside the strict parser; its message names the field.
struct FieldError {
  std::string message;
};

[[noreturn]] void Fail(std::string message) {
  throw FieldError{std::move(message)};
}

// A value as JSON text for a message; bytes that are not UTF-8 (a YAML job file can carry them)
// become U+FFFD instead of an exception (found by tests/fuzz/fuzz_job_yaml).
std::string Shown(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string TypeName(const json& value) {
  return value.type_name();
}

std::string String(const json& value, std::string_view field) {
  if (!value.is_string())
    Fail(fmt::format("'{}' must be a string, not {}", field, TypeName(value)));
  return value.get<std::string>();
}

bool Bool(const json& value, std::string_view field) {
  if (!value.is_boolean())
    Fail(fmt::format("'{}' must be true or false, not {}", field, TypeName(value)));
  return value.get<bool>();
}

int64_t Integer(const json& value, std::string_view field, int64_t min, int64_t max) {
  if (!value.is_number_integer())
    Fail(fmt::format("'{}' must be an integer, not {}", field,
                     value.is_number() ? Shown(value) : TypeName(value)));
  const int64_t number = value.get<int64_t>();
  if (number < min || number > max)
    Fail(fmt::format("'{}' must be between {} and {}, not {}", field, min, max, number));
  return number;
}

// A number, or a string the parser reads ("16Gi", "500m", "2h"); `scale` turns a bare JSON
// number into the parser's unit.
template <typename T, typename Parser>
T Quantity(const json& value, std::string_view field, Parser parse, std::string_view example) {
  std::optional<T> parsed;
  if (value.is_number()) {
    const double number = value.get<double>();
    if (std::isfinite(number) && number >= 0) parsed = parse(fmt::format("{}", number));
  } else if (value.is_string()) {
    parsed = parse(value.get<std::string>());
  }
  if (!parsed)
    Fail(fmt::format("'{}' must be a non-negative quantity such as {}, not {}", field, example,
                     Shown(value)));
  return *parsed;
}

// Bounds on what one job may carry (docs/api.md, "Limits"): each far above real use, and each a
// clear 400 rather than a record that strains the store, the scheduler or an agent's exec.
constexpr size_t kMaxListItems = 4096;  // command arguments, gpu_model entries
constexpr size_t kMaxEnvVars = 1024;
constexpr size_t kMaxStringBytes = 32768;  // one argument, one env value, the workdir

std::vector<std::string> StringList(const json& value, std::string_view field, bool allow_single) {
  std::vector<std::string> list;
  if (allow_single && value.is_string()) {
    list.push_back(value.get<std::string>());
    return list;
  }
  if (!value.is_array())
    Fail(fmt::format("'{}' must be a list of strings, not {}", field, TypeName(value)));
  if (value.size() > kMaxListItems)
    Fail(fmt::format("'{}' has {} items; at most {}", field, value.size(), kMaxListItems));
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string())
      Fail(fmt::format("'{}[{}]' must be a string, not {}", field, i, TypeName(value[i])));
    if (value[i].get_ref<const std::string&>().size() > kMaxStringBytes)
      Fail(fmt::format("'{}[{}]' is {} bytes; at most {}", field, i,
                       value[i].get_ref<const std::string&>().size(), kMaxStringBytes));
    list.push_back(value[i].get<std::string>());
  }
  return list;
}

// "image", "mounts" ("SRC:DST[:ro|rw]" strings or {source, target, read_only} objects) and
// "user" of a job or deployment.
ContainerSpec ContainerOrThrow(const json& body) {
  ContainerSpec spec;
  if (auto it = body.find("image"); it != body.end()) spec.image = String(*it, "image");
  if (auto it = body.find("user"); it != body.end()) {
    if (it->is_number_unsigned())
      spec.user = std::to_string(it->get<uint64_t>());
    else
      spec.user = String(*it, "user");
  }
  if (auto it = body.find("mounts"); it != body.end()) {
    if (!it->is_array()) Fail(fmt::format("'mounts' must be a list, not {}", TypeName(*it)));
    if (it->size() > kMaxContainerMounts)
      Fail(fmt::format("'mounts' has {} items; at most {}", it->size(), kMaxContainerMounts));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& item = (*it)[i];
      if (item.is_string()) {
        std::string error;
        auto mount = ParseContainerMount(item.get<std::string>(), error);
        if (!mount) Fail(fmt::format("'mounts[{}]': {}", i, error));
        spec.mounts.push_back(std::move(*mount));
      } else if (item.is_object()) {
        ContainerMount mount;
        for (const auto& [key, value] : item.items()) {
          if (key == "source") {
            mount.source = String(value, "mounts[].source");
          } else if (key == "target") {
            mount.target = String(value, "mounts[].target");
          } else if (key == "read_only") {
            mount.read_only = Bool(value, "mounts[].read_only");
          } else {
            Fail(fmt::format("'mounts[{}]': unknown field '{}' (known: source, target, read_only)",
                             i, key));
          }
        }
        spec.mounts.push_back(std::move(mount));
      } else {
        Fail(fmt::format("'mounts[{}]' must be \"SOURCE:TARGET[:ro|rw]\" or an object, not {}", i,
                         TypeName(item)));
      }
    }
  }
  if (auto error = ValidateContainerSpec(spec)) Fail(*error);
  return spec;
}

void ContainerToJson(json& out, const ContainerSpec& spec) {
  if (spec.image.empty()) return;
  out["image"] = spec.image;
  if (!spec.mounts.empty()) {
    json mounts = json::array();
    for (const ContainerMount& mount : spec.mounts)
      mounts.push_back(FormatContainerMount(mount));
    out["mounts"] = std::move(mounts);
  }
  if (!spec.user.empty()) out["user"] = spec.user;
}

bool ValidName(std::string_view text, size_t max_size) {
  if (text.empty() || text.size() > max_size) return false;
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

bool ValidEnvName(std::string_view name) {
  if (name.empty() || name.size() > 256 || std::isdigit(static_cast<unsigned char>(name.front())))
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// A user's "env": an object of valid variable names to strings.
std::map<std::string, std::string> EnvObject(const json& value) {
  if (!value.is_object()) Fail(fmt::format("'env' must be an object, not {}", TypeName(value)));
  if (value.size() > kMaxEnvVars)
    Fail(fmt::format("'env' has {} variables; at most {}", value.size(), kMaxEnvVars));
  std::map<std::string, std::string> env;
  for (const auto& [key, item] : value.items()) {
    if (!ValidEnvName(key))
      Fail(fmt::format("'env' has an invalid variable name '{}' (letters, digits and _)", key));
    env[key] = String(item, "env." + key);
    if (env[key].size() > kMaxStringBytes)
      Fail(fmt::format("'env.{}' is {} bytes; at most {}", key, env[key].size(), kMaxStringBytes));
  }
  return env;
}

// The number of GPUs as people write it: 1, 8 or 0.5.
json GpusJson(MilliGpu milli) {
  return milli % kMilliPerGpu == 0 ? json(milli / kMilliPerGpu)
                                   : json(static_cast<double>(milli) / kMilliPerGpu);
}

// Runs a strict parser (which throws FieldError), turning its failure into `error`.
template <typename Parse>
auto Strictly(Parse parse, const json& body, std::string& error)
    -> std::optional<decltype(parse(body))> {
  try {
    return parse(body);
  } catch (const FieldError& field_error) {
    error = field_error.message;
  }
  return std::nullopt;
}

std::optional<json> ParseJsonText(std::string_view text, std::string& error) {
  return ParseRequestJson(text, error);
}

const std::set<std::string, std::less<>> kSubmissionFields = {
    "name",           "queue",       "priority",    "tasks",       "nodes",
    "tasks_per_node", "gpus",        "cpu",         "memory",      "gpu_model",
    "command",        "env",         "workdir",     "image",       "mounts",
    "user",           "restartable", "preemptible", "max_runtime", "runtime_estimate",
    "min_gpu_memory", "grace_period"};

JobSubmission ParseSubmissionOrThrow(const json& body) {
  if (!body.is_object()) Fail(fmt::format("a job must be a JSON object, not {}", TypeName(body)));
  for (const auto& [key, value] : body.items()) {
    if (!kSubmissionFields.count(key))
      Fail(fmt::format("unknown field '{}' (known: {})", key, fmt::join(kSubmissionFields, ", ")));
  }
  JobSubmission job;
  if (auto it = body.find("name"); it != body.end()) job.name = String(*it, "name");
  if (auto it = body.find("queue"); it != body.end()) job.queue = String(*it, "queue");
  if (auto it = body.find("priority"); it != body.end())
    job.priority = static_cast<int32_t>(Integer(*it, "priority", -1'000'000, 1'000'000));
  constexpr int64_t kMaxTasks = 100'000;
  const bool tasks_given = body.contains("tasks");
  if (tasks_given)
    job.tasks = static_cast<int32_t>(Integer(body.at("tasks"), "tasks", 1, kMaxTasks));
  if (auto it = body.find("tasks_per_node"); it != body.end())
    job.tasks_per_node = static_cast<int32_t>(Integer(*it, "tasks_per_node", 1, 1024));
  if (auto it = body.find("nodes"); it != body.end()) {
    const int64_t nodes = Integer(*it, "nodes", 1, kMaxTasks);
    const int32_t per_node = std::max(job.tasks_per_node, 1);
    if (nodes * per_node > kMaxTasks)
      Fail(fmt::format("'nodes' {} x 'tasks_per_node' {} is more than {} tasks", nodes, per_node,
                       kMaxTasks));
    if (tasks_given && job.tasks != nodes * per_node)
      Fail(fmt::format("'tasks' {} is not 'nodes' {} x 'tasks_per_node' {}", job.tasks, nodes,
                       per_node));
    job.tasks = static_cast<int32_t>(nodes * per_node);
    job.tasks_per_node = per_node;
  } else if (job.tasks_per_node > 0) {
    if (!tasks_given) job.tasks = job.tasks_per_node;  // one node
    if (job.tasks % job.tasks_per_node != 0)
      Fail(fmt::format("'tasks' {} is not a multiple of 'tasks_per_node' {}", job.tasks,
                       job.tasks_per_node));
  }
  if (auto it = body.find("gpus"); it != body.end())
    job.gpu_milli_per_task = Quantity<MilliGpu>(*it, "gpus", ParseGpuMilli, "1, 8 or 0.5");
  if (auto it = body.find("cpu"); it != body.end())
    job.cpu_milli_per_task = Quantity<MilliCpu>(*it, "cpu", ParseCpuMilli, "4 or \"500m\"");
  if (auto it = body.find("memory"); it != body.end())
    job.memory_mib_per_task = Quantity<MiB>(*it, "memory", ParseMemoryMib, "\"16Gi\" or 1024");
  if (auto it = body.find("min_gpu_memory"); it != body.end())
    job.min_gpu_memory_mib = Quantity<MiB>(*it, "min_gpu_memory", ParseMemoryMib, "\"40Gi\"");
  if (auto it = body.find("gpu_model"); it != body.end())
    job.gpu_models = StringList(*it, "gpu_model", true);
  if (auto it = body.find("command"); it != body.end())
    job.command = StringList(*it, "command", false);
  if (auto it = body.find("env"); it != body.end()) job.env = EnvObject(*it);
  if (auto it = body.find("workdir"); it != body.end()) job.workdir = String(*it, "workdir");
  job.container = ContainerOrThrow(body);
  if (auto it = body.find("restartable"); it != body.end())
    job.restartable = Bool(*it, "restartable");
  if (auto it = body.find("preemptible"); it != body.end())
    job.preemptible = Bool(*it, "preemptible");
  if (auto it = body.find("max_runtime"); it != body.end())
    job.max_runtime_ms = Quantity<TimeMs>(*it, "max_runtime", ParseDurationMs, "\"2h\"");
  if (auto it = body.find("runtime_estimate"); it != body.end())
    job.runtime_estimate_ms = Quantity<TimeMs>(*it, "runtime_estimate", ParseDurationMs, "\"30m\"");
  if (auto it = body.find("grace_period"); it != body.end())
    job.grace_period_ms = Quantity<TimeMs>(*it, "grace_period", ParseDurationMs, "\"2m\"");

  if (job.command.empty() || job.command.front().empty())
    Fail("'command' is required: the program and its arguments, e.g. [\"python3\", \"train.py\"]");
  if (!job.name.empty() && !ValidName(job.name, 128))
    Fail(fmt::format("'name' must be 1-128 letters, digits, '-', '_' or '.', not '{}'", job.name));
  if (!ValidName(job.queue, 63))
    Fail(fmt::format("'queue' must be 1-63 letters, digits, '-', '_' or '.', not '{}'", job.queue));
  // A day: a checkpoint that takes longer is a stuck job, and the GPUs wait for it.
  constexpr TimeMs kMaxGracePeriodMs = 24 * 3600 * 1000;
  if (job.grace_period_ms > kMaxGracePeriodMs)
    Fail(fmt::format("'grace_period' must be at most 24h, not {} ms", job.grace_period_ms));
  if (job.workdir.size() > kMaxStringBytes)
    Fail(fmt::format("'workdir' is {} bytes; at most {}", job.workdir.size(), kMaxStringBytes));
  if (!job.workdir.empty() && job.workdir.front() != '/')
    Fail(fmt::format("'workdir' must be an absolute path, not '{}'", job.workdir));
  for (const std::string& model : job.gpu_models)
    if (model.empty()) Fail("'gpu_model' must not be empty");
  if (job.gpu_milli_per_task > kMilliPerGpu && job.gpu_milli_per_task % kMilliPerGpu != 0)
    Fail(
        fmt::format("'gpus' must be a whole number above 1 (a task takes whole GPUs, or a share "
                    "of one), not {}",
                    FormatGpus(job.gpu_milli_per_task)));
  JobSpec spec;
  spec.tasks = job.tasks;
  spec.gpu_milli_per_task = job.gpu_milli_per_task;
  spec.cpu_milli_per_task = job.cpu_milli_per_task;
  spec.memory_mib_per_task = job.memory_mib_per_task;
  if (auto problem = ValidateJobSpec(spec)) Fail(*problem);
  return job;
}

template <typename T>
void Optional(json& out, const char* key, const std::optional<T>& value) {
  if (value) out[key] = *value;
}

template <typename T>
void ReadOptional(const json& in, const char* key, std::optional<T>& value) {
  if (auto it = in.find(key); it != in.end() && !it->is_null()) value = it->get<T>();
}

template <typename T>
void Read(const json& in, const char* key, T& value) {
  if (auto it = in.find(key); it != in.end() && !it->is_null()) it->get_to(value);
}

}  // namespace

namespace {
struct TooDeep {};
}  // namespace

std::optional<json> ParseRequestJson(std::string_view text, std::string& error) {
  try {
    return json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxRequestJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    error = fmt::format("the JSON body nests deeper than {} levels", kMaxRequestJsonDepth);
  } catch (const json::exception& parse_error) {
    // parse_error, and out_of_range for a number past double's range ("1e99999"), found by
    // tests/fuzz/fuzz_api_json: was a 500.
    error = fmt::format("malformed JSON: {}", parse_error.what());
  }
  return std::nullopt;
}

std::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "pending";
    case JobState::kScheduled:
      return "scheduled";
    case JobState::kStarting:
      return "starting";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (JobState state :
       {JobState::kPending, JobState::kScheduled, JobState::kStarting, JobState::kRunning,
        JobState::kSucceeded, JobState::kFailed, JobState::kCancelled})
    if (JobStateName(state) == name) return state;
  return std::nullopt;
}

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

std::string_view NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kReady:
      return "ready";
    case NodeState::kDraining:
      return "draining";
    case NodeState::kLost:
      return "lost";
  }
  return "unknown";
}

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kAgent:
      return "agent";
    case Role::kGateway:
      return "gateway";
  }
  return "unknown";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (Role role : {Role::kAdmin, Role::kUser, Role::kAgent, Role::kGateway})
    if (RoleName(role) == name) return role;
  return std::nullopt;
}

std::string DefaultScope(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "submit";
    case Role::kAgent:
    case Role::kGateway:
      break;
  }
  return std::string(RoleName(role));
}

std::optional<std::string> ScopeError(Role role, std::string_view scope) {
  if (role == Role::kAgent || role == Role::kGateway) {
    if (scope == RoleName(role)) return std::nullopt;
    return fmt::format("a token of role {} has scope {}, not '{}'", RoleName(role), RoleName(role),
                       scope);
  }
  if (scope == "read" || scope == "submit") return std::nullopt;
  if (scope == "admin") {
    if (role == Role::kAdmin) return std::nullopt;
    return std::string("scope 'admin' needs role admin");
  }
  return fmt::format("'scope' must be read, submit or admin, not '{}'", scope);
}

std::string FormatGpus(MilliGpu milli) {
  if (milli % kMilliPerGpu == 0) return fmt::format("{}", milli / kMilliPerGpu);
  std::string text = fmt::format("{:.3f}", static_cast<double>(milli) / kMilliPerGpu);
  while (text.back() == '0')
    text.pop_back();
  return text;
}

std::optional<JobSubmission> ParseJobSubmission(const json& body, std::string& error) {
  return Strictly(ParseSubmissionOrThrow, body, error);
}

std::optional<JobSubmission> ParseJobSubmissionText(std::string_view text, std::string& error) {
  auto body = ParseJsonText(text, error);
  return body ? ParseJobSubmission(*body, error) : std::nullopt;
}

// ---- JobSubmission: the user's own shape -----------------------------------------------------

void to_json(json& out, const JobSubmission& value) {
  out = json{{"name", value.name},
             {"queue", value.queue},
             {"priority", value.priority},
             {"tasks", value.tasks},
             {"gpus", GpusJson(value.gpu_milli_per_task)},
             {"cpu", fmt::format("{}m", value.cpu_milli_per_task)},
             {"memory", fmt::format("{}Mi", value.memory_mib_per_task)},
             {"gpu_model", value.gpu_models},
             {"command", value.command},
             {"env", value.env},
             {"workdir", value.workdir},
             {"restartable", value.restartable},
             {"preemptible", value.preemptible},
             {"max_runtime", fmt::format("{}ms", value.max_runtime_ms)},
             {"grace_period", fmt::format("{}ms", value.grace_period_ms)}};
  if (value.tasks_per_node > 0) out["tasks_per_node"] = value.tasks_per_node;
  if (value.min_gpu_memory_mib > 0)
    out["min_gpu_memory"] = fmt::format("{}Mi", value.min_gpu_memory_mib);
  if (value.runtime_estimate_ms)
    out["runtime_estimate"] = fmt::format("{}ms", *value.runtime_estimate_ms);
  ContainerToJson(out, value.container);
}

void from_json(const json& in, JobSubmission& value) {
  std::string error;
  auto parsed = ParseJobSubmission(in, error);
  if (!parsed) throw std::invalid_argument(error);
  value = std::move(*parsed);
}

// ---- The rest: plain field-for-field objects -------------------------------------------------

void to_json(json& out, const JobEvent& value) {
  out = json{
      {"time_ms", value.time_ms}, {"from", value.from}, {"to", value.to}, {"reason", value.reason}};
}
void from_json(const json& in, JobEvent& value) {
  Read(in, "time_ms", value.time_ms);
  Read(in, "from", value.from);
  Read(in, "to", value.to);
  Read(in, "reason", value.reason);
}

void to_json(json& out, const TaskStatus& value) {
  out = json{{"rank", value.rank},
             {"node", value.node},
             {"gpu_indices", value.gpu_indices},
             {"gpu_uuids", value.gpu_uuids},
             {"gpu_milli", value.gpu_milli},
             {"workload_id", value.workload_id},
             {"state", value.state},
             {"error", value.error}};
  Optional(out, "exit_code", value.exit_code);
  Optional(out, "signal", value.signal);
  if (value.port > 0) {
    out["port"] = value.port;
    out["ready"] = value.ready;
  }
}
void from_json(const json& in, TaskStatus& value) {
  Read(in, "rank", value.rank);
  Read(in, "node", value.node);
  Read(in, "gpu_indices", value.gpu_indices);
  Read(in, "gpu_uuids", value.gpu_uuids);
  Read(in, "gpu_milli", value.gpu_milli);
  Read(in, "workload_id", value.workload_id);
  Read(in, "state", value.state);
  Read(in, "error", value.error);
  ReadOptional(in, "exit_code", value.exit_code);
  ReadOptional(in, "signal", value.signal);
  Read(in, "port", value.port);
  Read(in, "ready", value.ready);
}

void to_json(json& out, const ReplicaOf& value) {
  out = json{{"deployment", value.deployment},
             {"generation", value.generation},
             {"readiness_path", value.readiness_path},
             {"draining_since_ms", value.draining_since_ms}};
}
void from_json(const json& in, ReplicaOf& value) {
  Read(in, "deployment", value.deployment);
  Read(in, "generation", value.generation);
  Read(in, "readiness_path", value.readiness_path);
  Read(in, "draining_since_ms", value.draining_since_ms);
}

void to_json(json& out, const JobRecord& value) {
  out = json{{"id", value.id},
             {"user", value.user},
             {"team", value.team},
             {"spec", value.spec},
             {"state", JobStateName(value.state)},
             {"reason", value.reason},
             {"reason_code", value.reason_code},
             {"created_ms", value.created_ms},
             {"started_ms", value.started_ms},
             {"finished_ms", value.finished_ms},
             {"attempt", value.attempt},
             {"tasks", value.tasks},
             {"events", value.events}};
  Optional(out, "exit_code", value.exit_code);
  Optional(out, "idle_since_ms", value.idle_since_ms);
  Optional(out, "replica", value.replica);
}
void from_json(const json& in, JobRecord& value) {
  Read(in, "id", value.id);
  Read(in, "user", value.user);
  Read(in, "team", value.team);
  if (auto it = in.find("spec"); it != in.end()) value.spec = it->get<JobSubmission>();
  std::string state;
  Read(in, "state", state);
  if (auto parsed = ParseJobState(state))
    value.state = *parsed;
  else
    throw std::invalid_argument(fmt::format("unknown job state '{}'", state));
  Read(in, "reason", value.reason);
  Read(in, "reason_code", value.reason_code);
  Read(in, "created_ms", value.created_ms);
  Read(in, "started_ms", value.started_ms);
  Read(in, "finished_ms", value.finished_ms);
  Read(in, "attempt", value.attempt);
  Read(in, "tasks", value.tasks);
  Read(in, "events", value.events);
  ReadOptional(in, "exit_code", value.exit_code);
  ReadOptional(in, "idle_since_ms", value.idle_since_ms);
  ReadOptional(in, "replica", value.replica);
}

void to_json(json& out, const GpuStatus& value) {
  out = json{{"index", value.index},
             {"uuid", value.uuid},
             {"model", value.model},
             {"memory_mib", value.memory_mib},
             {"nvlink_island", value.nvlink_island},
             {"healthy", value.healthy},
             {"health_reason", value.health_reason},
             {"utilization_pct", value.utilization_pct},
             {"memory_used_mib", value.memory_used_mib},
             {"temperature_c", value.temperature_c},
             {"power_w", value.power_w}};
}
void from_json(const json& in, GpuStatus& value) {
  Read(in, "index", value.index);
  Read(in, "uuid", value.uuid);
  Read(in, "model", value.model);
  Read(in, "memory_mib", value.memory_mib);
  Read(in, "nvlink_island", value.nvlink_island);
  Read(in, "healthy", value.healthy);
  Read(in, "health_reason", value.health_reason);
  Read(in, "utilization_pct", value.utilization_pct);
  Read(in, "memory_used_mib", value.memory_used_mib);
  Read(in, "temperature_c", value.temperature_c);
  Read(in, "power_w", value.power_w);
}

void to_json(json& out, const NodeReport& value) {
  out = json{{"name", value.name},
             {"address", value.address},
             {"agent_url", value.agent_url},
             {"backend", value.backend},
             {"rack", value.rack},
             {"spine", value.spine},
             {"agent_version", value.agent_version},
             {"cpu_milli", value.cpu_milli},
             {"memory_mib", value.memory_mib},
             {"gpus", value.gpus}};
}
void from_json(const json& in, NodeReport& value) {
  Read(in, "name", value.name);
  Read(in, "address", value.address);
  Read(in, "agent_url", value.agent_url);
  Read(in, "backend", value.backend);
  Read(in, "rack", value.rack);
  Read(in, "spine", value.spine);
  Read(in, "agent_version", value.agent_version);
  Read(in, "cpu_milli", value.cpu_milli);
  Read(in, "memory_mib", value.memory_mib);
  Read(in, "gpus", value.gpus);
}

void to_json(json& out, const NodeRecord& value) {
  json gpu_jobs = json::object();
  for (const auto& [index, jobs] : value.gpu_jobs)
    gpu_jobs[std::to_string(index)] = jobs;
  out = json{{"report", value.report},
             {"state", NodeStateName(value.state)},
             {"drained", value.drained},
             {"registered_ms", value.registered_ms},
             {"last_seen_ms", value.last_seen_ms},
             {"gpu_jobs", gpu_jobs}};
}
void from_json(const json& in, NodeRecord& value) {
  Read(in, "report", value.report);
  std::string state;
  Read(in, "state", state);
  value.state = state == "lost"       ? NodeState::kLost
                : state == "draining" ? NodeState::kDraining
                                      : NodeState::kReady;
  Read(in, "drained", value.drained);
  Read(in, "registered_ms", value.registered_ms);
  Read(in, "last_seen_ms", value.last_seen_ms);
  value.gpu_jobs.clear();
  if (auto it = in.find("gpu_jobs"); it != in.end() && it->is_object())
    for (const auto& [index, jobs] : it->items())
      value.gpu_jobs[std::stoi(index)] = jobs.get<std::vector<JobId>>();
}

void to_json(json& out, const QueueStatus& value) {
  out = json{{"name", value.name},
             {"pending", value.pending},
             {"running", value.running},
             {"gpus_pending", FormatGpus(value.gpu_milli_pending)},
             {"gpus_running", FormatGpus(value.gpu_milli_running)},
             {"gpu_milli_pending", value.gpu_milli_pending},
             {"gpu_milli_running", value.gpu_milli_running},
             {"configured", value.configured},
             {"cohort", value.cohort},
             {"gpu_milli_guaranteed", value.gpu_milli_guaranteed},
             {"weight", value.weight},
             {"fair_share_usage_gpu_hours", value.fair_share_usage_gpu_hours},
             {"fair_share_factor", value.fair_share_factor},
             {"teams", value.teams}};
  if (value.gpu_milli_borrowing_limit)
    out["gpu_milli_borrowing_limit"] = *value.gpu_milli_borrowing_limit;
}
void from_json(const json& in, QueueStatus& value) {
  Read(in, "name", value.name);
  Read(in, "pending", value.pending);
  Read(in, "running", value.running);
  Read(in, "gpu_milli_pending", value.gpu_milli_pending);
  Read(in, "gpu_milli_running", value.gpu_milli_running);
  Read(in, "configured", value.configured);
  Read(in, "cohort", value.cohort);
  Read(in, "gpu_milli_guaranteed", value.gpu_milli_guaranteed);
  ReadOptional(in, "gpu_milli_borrowing_limit", value.gpu_milli_borrowing_limit);
  Read(in, "weight", value.weight);
  Read(in, "fair_share_usage_gpu_hours", value.fair_share_usage_gpu_hours);
  Read(in, "fair_share_factor", value.fair_share_factor);
  Read(in, "teams", value.teams);
}

void to_json(json& out, const TokenInfo& value) {
  out = json{{"id", value.id},
             {"user", value.user},
             {"team", value.team},
             {"role", RoleName(value.role)},
             {"scope", value.scope},
             {"created_ms", value.created_ms},
             {"created_by", value.created_by},
             {"expires_ms", value.expires_ms}};
  if (!value.rotated_to.empty()) out["rotated_to"] = value.rotated_to;
}
void from_json(const json& in, TokenInfo& value) {
  Read(in, "id", value.id);
  Read(in, "user", value.user);
  Read(in, "team", value.team);
  std::string role;
  Read(in, "role", role);
  if (auto parsed = ParseRole(role))
    value.role = *parsed;
  else
    throw std::invalid_argument(fmt::format("unknown role '{}'", role));
  Read(in, "created_ms", value.created_ms);
  Read(in, "created_by", value.created_by);
  Read(in, "scope", value.scope);
  // Tokens stored before scopes existed had their role's full powers.
  if (value.scope.empty()) value.scope = DefaultScope(value.role);
  Read(in, "expires_ms", value.expires_ms);
  Read(in, "rotated_to", value.rotated_to);
}

void to_json(json& out, const AuditEntry& value) {
  out = json{{"seq", value.seq},           {"time_ms", value.time_ms}, {"user", value.user},
             {"token_id", value.token_id}, {"action", value.action},   {"target", value.target},
             {"detail", value.detail}};
}
void from_json(const json& in, AuditEntry& value) {
  Read(in, "seq", value.seq);
  Read(in, "time_ms", value.time_ms);
  Read(in, "user", value.user);
  Read(in, "token_id", value.token_id);
  Read(in, "action", value.action);
  Read(in, "target", value.target);
  Read(in, "detail", value.detail);
}

void to_json(json& out, const WorkloadReport& value) {
  out = json{{"workload_id", value.workload_id},
             {"job_id", value.job_id},
             {"rank", value.rank},
             {"attempt", value.attempt},
             {"state", value.state},
             {"error", value.error},
             {"started_ms", value.started_ms},
             {"finished_ms", value.finished_ms},
             {"ready", value.ready}};
  Optional(out, "exit_code", value.exit_code);
  Optional(out, "signal", value.signal);
}
void from_json(const json& in, WorkloadReport& value) {
  Read(in, "workload_id", value.workload_id);
  Read(in, "job_id", value.job_id);
  Read(in, "rank", value.rank);
  Read(in, "attempt", value.attempt);
  Read(in, "state", value.state);
  Read(in, "error", value.error);
  Read(in, "started_ms", value.started_ms);
  Read(in, "finished_ms", value.finished_ms);
  Read(in, "ready", value.ready);
  ReadOptional(in, "exit_code", value.exit_code);
  ReadOptional(in, "signal", value.signal);
}

void to_json(json& out, const SyncRequest& value) {
  out = json{{"node", value.node},
             {"workloads", value.workloads},
             {"known_version", value.known_version},
             {"wait_ms", value.wait_ms}};
  if (!value.agent_key.empty()) out["agent_key"] = value.agent_key;
}
void from_json(const json& in, SyncRequest& value) {
  Read(in, "node", value.node);
  Read(in, "workloads", value.workloads);
  Read(in, "known_version", value.known_version);
  Read(in, "wait_ms", value.wait_ms);
  Read(in, "agent_key", value.agent_key);
}

void to_json(json& out, const TaskLaunch& value) {
  out = json{{"workload_id", value.workload_id},
             {"job_id", value.job_id},
             {"rank", value.rank},
             {"attempt", value.attempt},
             {"user", value.user},
             {"argv", value.argv},
             {"env", value.env},
             {"workdir", value.workdir},
             {"gpu_indices", value.gpu_indices},
             {"gpu_milli", value.gpu_milli},
             {"cpu_milli", value.cpu_milli},
             {"memory_mib", value.memory_mib},
             {"max_runtime_ms", value.max_runtime_ms},
             {"grace_period_ms", value.grace_period_ms},
             {"checkpoint_dir", value.checkpoint_dir}};
  if (value.port > 0) {
    out["port"] = value.port;
    out["readiness_path"] = value.readiness_path;
  }
  // Nested: "user" here is the platform user who submitted the job.
  if (!value.container.image.empty()) {
    json container = json::object();
    ContainerToJson(container, value.container);
    out["container"] = std::move(container);
  }
}
void from_json(const json& in, TaskLaunch& value) {
  Read(in, "workload_id", value.workload_id);
  Read(in, "job_id", value.job_id);
  Read(in, "rank", value.rank);
  Read(in, "attempt", value.attempt);
  Read(in, "user", value.user);
  Read(in, "argv", value.argv);
  Read(in, "env", value.env);
  Read(in, "workdir", value.workdir);
  Read(in, "gpu_indices", value.gpu_indices);
  Read(in, "gpu_milli", value.gpu_milli);
  Read(in, "cpu_milli", value.cpu_milli);
  Read(in, "memory_mib", value.memory_mib);
  Read(in, "max_runtime_ms", value.max_runtime_ms);
  Read(in, "grace_period_ms", value.grace_period_ms);
  Read(in, "checkpoint_dir", value.checkpoint_dir);
  Read(in, "port", value.port);
  Read(in, "readiness_path", value.readiness_path);
  if (auto it = in.find("container"); it != in.end() && it->is_object()) {
    try {
      value.container = ContainerOrThrow(*it);
    } catch (const FieldError& error) {
      // Callers of from_json handle nlohmann's exceptions.
      throw json::other_error::create(501, "container: " + error.message, nullptr);
    }
  }
}

void to_json(json& out, const SyncResponse& value) {
  out = json{
      {"version", value.version}, {"desired", value.desired}, {"heartbeat_ms", value.heartbeat_ms}};
}
void from_json(const json& in, SyncResponse& value) {
  Read(in, "version", value.version);
  Read(in, "desired", value.desired);
  Read(in, "heartbeat_ms", value.heartbeat_ms);
}

// ---- Deployments ------------------------------------------------------------------------------

namespace {

double Number(const json& value, std::string_view field, double min, double max) {
  if (!value.is_number())
    Fail(fmt::format("'{}' must be a number, not {}", field, TypeName(value)));
  const double number = value.get<double>();
  if (!std::isfinite(number) || number < min || number > max)
    Fail(fmt::format("'{}' must be between {:g} and {:g}, not {}", field, min, max, Shown(value)));
  return number;
}

void RefuseUnknown(const json& object, const std::set<std::string, std::less<>>& known,
                   std::string_view what) {
  for (const auto& [key, value] : object.items())
    if (!known.count(key))
      Fail(fmt::format("unknown {} field '{}' (known: {})", what, key, fmt::join(known, ", ")));
}

const std::set<std::string, std::less<>> kAutoscalingFields = {"metric",
                                                               "target",
                                                               "target_utilization",
                                                               "stable_window",
                                                               "panic_window",
                                                               "panic_threshold",
                                                               "scale_to_zero_grace",
                                                               "max_scale_up_rate",
                                                               "max_scale_down_rate"};

AutoscalingSpec ParseAutoscalingOrThrow(const json& body) {
  if (!body.is_object())
    Fail(fmt::format("'autoscaling' must be an object, not {}", TypeName(body)));
  RefuseUnknown(body, kAutoscalingFields, "autoscaling");
  AutoscalingSpec spec;
  auto duration = [&](const char* key, TimeMs& into) {
    if (auto it = body.find(key); it != body.end())
      into = Quantity<TimeMs>(*it, std::string("autoscaling.") + key, ParseDurationMs, "\"60s\"");
  };
  if (auto it = body.find("metric"); it != body.end()) {
    spec.metric = String(*it, "autoscaling.metric");
    if (spec.metric != "concurrency" && spec.metric != "rps")
      Fail(fmt::format("'autoscaling.metric' must be concurrency or rps, not '{}'", spec.metric));
  }
  if (auto it = body.find("target"); it != body.end())
    spec.target = Number(*it, "autoscaling.target", 0.01, 1e6);
  if (auto it = body.find("target_utilization"); it != body.end())
    spec.target_utilization = Number(*it, "autoscaling.target_utilization", 0.01, 1.0);
  duration("stable_window", spec.stable_window_ms);
  duration("panic_window", spec.panic_window_ms);
  duration("scale_to_zero_grace", spec.scale_to_zero_grace_ms);
  if (auto it = body.find("panic_threshold"); it != body.end())
    spec.panic_threshold = Number(*it, "autoscaling.panic_threshold", 1.1, 10.0);
  if (auto it = body.find("max_scale_up_rate"); it != body.end())
    spec.max_scale_up_rate = Number(*it, "autoscaling.max_scale_up_rate", 1.1, 1e6);
  if (auto it = body.find("max_scale_down_rate"); it != body.end())
    spec.max_scale_down_rate = Number(*it, "autoscaling.max_scale_down_rate", 1.1, 1e6);
  constexpr TimeMs kHour = 3600 * 1000;
  if (spec.stable_window_ms < 6000 || spec.stable_window_ms > kHour)
    Fail(fmt::format("'autoscaling.stable_window' must be from 6s to 1h, not {} ms",
                     spec.stable_window_ms));
  if (spec.panic_window_ms < 1000 || spec.panic_window_ms > spec.stable_window_ms)
    Fail(
        fmt::format("'autoscaling.panic_window' must be from 1s to the stable window ({} ms), "
                    "not {} ms",
                    spec.stable_window_ms, spec.panic_window_ms));
  if (spec.scale_to_zero_grace_ms > kHour)
    Fail(fmt::format("'autoscaling.scale_to_zero_grace' must be at most 1h, not {} ms",
                     spec.scale_to_zero_grace_ms));
  return spec;
}

const std::set<std::string, std::less<>> kDeploymentFields = {
    "name",           "queue",        "priority",     "command",        "env",
    "workdir",        "gpus",         "cpu",          "memory",         "gpu_model",
    "min_gpu_memory", "min_replicas", "max_replicas", "readiness_path", "models",
    "routing",        "autoscaling",  "grace_period", "drain_timeout",  "image",
    "mounts",         "user"};

const std::set<std::string, std::less<>> kRoutings = {"round_robin", "least_outstanding",
                                                      "endpoint_picker"};

DeploymentSpec ParseDeploymentOrThrow(const json& body) {
  if (!body.is_object())
    Fail(fmt::format("a deployment must be a JSON object, not {}", TypeName(body)));
  RefuseUnknown(body, kDeploymentFields, "deployment");
  DeploymentSpec spec;
  if (auto it = body.find("name"); it != body.end()) spec.name = String(*it, "name");
  if (!ValidDeploymentName(spec.name))
    Fail(
        fmt::format("'name' must be a DNS label: 1-63 lower-case letters, digits and '-', "
                    "starting with a letter and not ending with '-', not '{}'",
                    spec.name));
  if (auto it = body.find("queue"); it != body.end()) spec.queue = String(*it, "queue");
  if (!ValidName(spec.queue, 63))
    Fail(
        fmt::format("'queue' must be 1-63 letters, digits, '-', '_' or '.', not '{}'", spec.queue));
  if (auto it = body.find("priority"); it != body.end())
    spec.priority = static_cast<int32_t>(Integer(*it, "priority", -1'000'000, 1'000'000));
  if (auto it = body.find("command"); it != body.end())
    spec.command = StringList(*it, "command", false);
  if (spec.command.empty() || spec.command.front().empty())
    Fail(
        "'command' is required: the model server and its arguments, e.g. [\"vllm\", \"serve\", "
        "\"model\"]");
  if (auto it = body.find("env"); it != body.end()) spec.env = EnvObject(*it);
  if (auto it = body.find("workdir"); it != body.end()) spec.workdir = String(*it, "workdir");
  if (!spec.workdir.empty() && spec.workdir.front() != '/')
    Fail(fmt::format("'workdir' must be an absolute path, not '{}'", spec.workdir));
  spec.container = ContainerOrThrow(body);
  if (auto it = body.find("gpus"); it != body.end())
    spec.gpu_milli_per_replica = Quantity<MilliGpu>(*it, "gpus", ParseGpuMilli, "1 or 0.5");
  if (auto it = body.find("cpu"); it != body.end())
    spec.cpu_milli_per_replica = Quantity<MilliCpu>(*it, "cpu", ParseCpuMilli, "4 or \"500m\"");
  if (auto it = body.find("memory"); it != body.end())
    spec.memory_mib_per_replica = Quantity<MiB>(*it, "memory", ParseMemoryMib, "\"16Gi\"");
  if (auto it = body.find("min_gpu_memory"); it != body.end())
    spec.min_gpu_memory_mib = Quantity<MiB>(*it, "min_gpu_memory", ParseMemoryMib, "\"40Gi\"");
  if (auto it = body.find("gpu_model"); it != body.end())
    spec.gpu_models = StringList(*it, "gpu_model", true);
  for (const std::string& model : spec.gpu_models)
    if (model.empty()) Fail("'gpu_model' must not be empty");
  if (spec.gpu_milli_per_replica > kMilliPerGpu && spec.gpu_milli_per_replica % kMilliPerGpu != 0)
    Fail(fmt::format("'gpus' must be a whole number above 1, or a share of one GPU, not {}",
                     FormatGpus(spec.gpu_milli_per_replica)));
  constexpr int64_t kMaxReplicas = 1000;
  if (auto it = body.find("min_replicas"); it != body.end())
    spec.min_replicas = static_cast<int32_t>(Integer(*it, "min_replicas", 0, kMaxReplicas));
  if (auto it = body.find("max_replicas"); it != body.end())
    spec.max_replicas = static_cast<int32_t>(Integer(*it, "max_replicas", 1, kMaxReplicas));
  else if (spec.min_replicas > spec.max_replicas)
    spec.max_replicas = spec.min_replicas;
  if (spec.min_replicas > spec.max_replicas)
    Fail(fmt::format("'min_replicas' ({}) must not be above 'max_replicas' ({})", spec.min_replicas,
                     spec.max_replicas));
  if (auto it = body.find("readiness_path"); it != body.end())
    spec.readiness_path = String(*it, "readiness_path");
  if (spec.readiness_path.empty() || spec.readiness_path.front() != '/' ||
      spec.readiness_path.size() > 256 ||
      std::any_of(spec.readiness_path.begin(), spec.readiness_path.end(),
                  [](char c) { return c <= ' ' || c == 0x7f; }))
    Fail(
        fmt::format("'readiness_path' must be a path such as /health (at most 256 characters, "
                    "no spaces), not '{}'",
                    spec.readiness_path));
  if (auto it = body.find("models"); it != body.end())
    spec.models = StringList(*it, "models", true);
  if (spec.models.size() > 64)
    Fail(fmt::format("'models' may name at most 64 models, not {}", spec.models.size()));
  for (const std::string& model : spec.models)
    if (model.empty() || model.size() > 128 ||
        std::any_of(model.begin(), model.end(), [](char c) { return c <= ' ' || c == 0x7f; }))
      Fail(
          fmt::format("'models' entries must be 1-128 characters without spaces, not '{}'", model));
  if (auto it = body.find("routing"); it != body.end()) spec.routing = String(*it, "routing");
  if (!kRoutings.count(spec.routing))
    Fail(fmt::format("'routing' must be one of {}, not '{}'", fmt::join(kRoutings, ", "),
                     spec.routing));
  if (auto it = body.find("autoscaling"); it != body.end())
    spec.autoscaling = ParseAutoscalingOrThrow(*it);
  if (auto it = body.find("grace_period"); it != body.end())
    spec.grace_period_ms = Quantity<TimeMs>(*it, "grace_period", ParseDurationMs, "\"30s\"");
  if (auto it = body.find("drain_timeout"); it != body.end())
    spec.drain_timeout_ms = Quantity<TimeMs>(*it, "drain_timeout", ParseDurationMs, "\"5m\"");
  constexpr TimeMs kDay = 24 * 3600 * 1000;
  if (spec.grace_period_ms > kDay || spec.drain_timeout_ms > kDay)
    Fail("'grace_period' and 'drain_timeout' must be at most 24h");
  JobSpec shape;
  shape.gpu_milli_per_task = spec.gpu_milli_per_replica;
  shape.cpu_milli_per_task = spec.cpu_milli_per_replica;
  shape.memory_mib_per_task = spec.memory_mib_per_replica;
  if (auto problem = ValidateJobSpec(shape)) Fail(*problem);
  return spec;
}

std::string DurationText(TimeMs ms) {
  return fmt::format("{}ms", ms);
}

}  // namespace

bool ValidDeploymentName(std::string_view name) {
  if (name.empty() || name.size() > 63 || !std::islower(static_cast<unsigned char>(name.front())) ||
      name.back() == '-')
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '-';
  });
}

std::optional<DeploymentSpec> ParseDeploymentSpec(const json& body, std::string& error) {
  return Strictly(ParseDeploymentOrThrow, body, error);
}

std::optional<DeploymentSpec> ParseDeploymentSpecText(std::string_view text, std::string& error) {
  auto body = ParseJsonText(text, error);
  return body ? ParseDeploymentSpec(*body, error) : std::nullopt;
}

void to_json(json& out, const AutoscalingSpec& value) {
  out = json{{"metric", value.metric},
             {"target", value.target},
             {"target_utilization", value.target_utilization},
             {"stable_window", DurationText(value.stable_window_ms)},
             {"panic_window", DurationText(value.panic_window_ms)},
             {"panic_threshold", value.panic_threshold},
             {"scale_to_zero_grace", DurationText(value.scale_to_zero_grace_ms)},
             {"max_scale_up_rate", value.max_scale_up_rate},
             {"max_scale_down_rate", value.max_scale_down_rate}};
}

void to_json(json& out, const DeploymentSpec& value) {
  out = json{{"name", value.name},
             {"queue", value.queue},
             {"priority", value.priority},
             {"command", value.command},
             {"env", value.env},
             {"workdir", value.workdir},
             {"gpus", GpusJson(value.gpu_milli_per_replica)},
             {"cpu", fmt::format("{}m", value.cpu_milli_per_replica)},
             {"memory", fmt::format("{}Mi", value.memory_mib_per_replica)},
             {"gpu_model", value.gpu_models},
             {"min_replicas", value.min_replicas},
             {"max_replicas", value.max_replicas},
             {"readiness_path", value.readiness_path},
             {"models", value.models},
             {"routing", value.routing},
             {"autoscaling", value.autoscaling},
             {"grace_period", DurationText(value.grace_period_ms)},
             {"drain_timeout", DurationText(value.drain_timeout_ms)}};
  if (value.min_gpu_memory_mib > 0)
    out["min_gpu_memory"] = fmt::format("{}Mi", value.min_gpu_memory_mib);
  ContainerToJson(out, value.container);
}
void from_json(const json& in, DeploymentSpec& value) {
  std::string error;
  auto parsed = ParseDeploymentSpec(in, error);
  if (!parsed) throw std::invalid_argument(error);
  value = std::move(*parsed);
}

void to_json(json& out, const ReplicaStatus& value) {
  out = json{{"job_id", value.job_id},
             {"generation", value.generation},
             {"state", value.state},
             {"node", value.node},
             {"host", value.host},
             {"port", value.port},
             {"created_ms", value.created_ms}};
}
void from_json(const json& in, ReplicaStatus& value) {
  Read(in, "job_id", value.job_id);
  Read(in, "generation", value.generation);
  Read(in, "state", value.state);
  Read(in, "node", value.node);
  Read(in, "host", value.host);
  Read(in, "port", value.port);
  Read(in, "created_ms", value.created_ms);
}

void to_json(json& out, const DeploymentRecord& value) {
  out = json{{"name", value.name},
             {"user", value.user},
             {"team", value.team},
             {"spec", value.spec},
             {"generation", value.generation},
             {"desired_replicas", value.desired_replicas},
             {"desired_reason", value.desired_reason},
             {"created_ms", value.created_ms},
             {"updated_ms", value.updated_ms},
             {"failures_in_a_row", value.failures_in_a_row},
             {"last_failure_ms", value.last_failure_ms},
             {"replicas", value.replicas},
             {"ready_replicas", value.ready_replicas}};
  Optional(out, "fixed_replicas", value.fixed_replicas);
}
void from_json(const json& in, DeploymentRecord& value) {
  Read(in, "name", value.name);
  Read(in, "user", value.user);
  Read(in, "team", value.team);
  if (auto it = in.find("spec"); it != in.end()) value.spec = it->get<DeploymentSpec>();
  Read(in, "generation", value.generation);
  Read(in, "desired_replicas", value.desired_replicas);
  Read(in, "desired_reason", value.desired_reason);
  ReadOptional(in, "fixed_replicas", value.fixed_replicas);
  Read(in, "created_ms", value.created_ms);
  Read(in, "updated_ms", value.updated_ms);
  Read(in, "failures_in_a_row", value.failures_in_a_row);
  Read(in, "last_failure_ms", value.last_failure_ms);
  Read(in, "replicas", value.replicas);
  Read(in, "ready_replicas", value.ready_replicas);
}

void to_json(json& out, const EndpointInfo& value) {
  out = json{{"id", value.id}, {"host", value.host}, {"port", value.port}};
}
void from_json(const json& in, EndpointInfo& value) {
  Read(in, "id", value.id);
  Read(in, "host", value.host);
  Read(in, "port", value.port);
}

void to_json(json& out, const DeploymentEndpoints& value) {
  out = json{{"name", value.name},
             {"team", value.team},
             {"models", value.models},
             {"routing", value.routing},
             {"endpoints", value.endpoints}};
}
void from_json(const json& in, DeploymentEndpoints& value) {
  Read(in, "name", value.name);
  Read(in, "team", value.team);
  Read(in, "models", value.models);
  Read(in, "routing", value.routing);
  Read(in, "endpoints", value.endpoints);
}

void to_json(json& out, const EndpointSet& value) {
  out = json{{"version", value.version}, {"deployments", value.deployments}};
}
void from_json(const json& in, EndpointSet& value) {
  Read(in, "version", value.version);
  Read(in, "deployments", value.deployments);
}

void to_json(json& out, const DeploymentLoadReport& value) {
  out = json{{"name", value.name},
             {"concurrency", value.concurrency},
             {"arrivals", value.arrivals},
             {"buffered", value.buffered},
             {"in_flight", value.in_flight}};
}
void from_json(const json& in, DeploymentLoadReport& value) {
  Read(in, "name", value.name);
  Read(in, "concurrency", value.concurrency);
  Read(in, "arrivals", value.arrivals);
  Read(in, "buffered", value.buffered);
  Read(in, "in_flight", value.in_flight);
}

void to_json(json& out, const GatewayReport& value) {
  out = json{{"gateway", value.gateway},
             {"interval_ms", value.interval_ms},
             {"deployments", value.deployments}};
}
void from_json(const json& in, GatewayReport& value) {
  Read(in, "gateway", value.gateway);
  Read(in, "interval_ms", value.interval_ms);
  Read(in, "deployments", value.deployments);
}

}  // namespace gpufleet::api
