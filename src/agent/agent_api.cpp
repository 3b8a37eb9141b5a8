#include "agent/agent_api.h"

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/gpu_metrics.h"
#include "core/version.h"
#include "net/secrets.h"

namespace gpufleet::agent {
namespace {

using Json = nlohmann::ordered_json;

int HttpStatusOf(AgentErrorKind kind) {
  switch (kind) {
    case AgentErrorKind::kBadRequest:
      return 400;
    case AgentErrorKind::kNotFound:
      return 404;
    case AgentErrorKind::kConflict:
      return 409;
    case AgentErrorKind::kInternal:
      return 500;
  }
  return 500;
}

net::HttpResponse ErrorResponse(const AgentError& error) {
  return net::HttpResponse::Error(HttpStatusOf(error.kind), error.message);
}

net::HttpResponse JsonResponse(int status, const Json& body) {
  return net::HttpResponse::Json(status, body.dump(2) + "\n");
}

AgentError BadRequest(std::string message) {
  return {AgentErrorKind::kBadRequest, std::move(message)};
}

// Parses a request body that must be a JSON object with only `known` fields. An empty body is
// an empty object when `empty_ok`.
std::optional<Json> ParseObject(std::string_view text, const std::set<std::string>& known,
                                bool empty_ok, AgentError& error) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    if (empty_ok) return Json::object();
    error = BadRequest("the request body is empty; expected a JSON object");
    return std::nullopt;
  }
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::exception& parse_error) {  // out_of_range too: "1e99999"
    std::string message = parse_error.what();
    // "[json.exception.parse_error.101] parse error at line 1, ...": keep the readable part.
    if (size_t bracket = message.find("] ");
        message.rfind("[json.", 0) == 0 && bracket != std::string::npos)
      message = message.substr(bracket + 2);
    error = BadRequest("malformed JSON: " + message);
    return std::nullopt;
  }
  if (!body.is_object()) {
    error = BadRequest(fmt::format("expected a JSON object, got {}", body.type_name()));
    return std::nullopt;
  }
  for (const auto& [key, value] : body.items()) {
    if (!known.count(key)) {
      error = BadRequest(
          fmt::format("unknown field '{}' (known fields: {})", key, fmt::join(known, ", ")));
      return std::nullopt;
    }
  }
  return body;
}

std::optional<int64_t> IntegerField(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto number = value.get<uint64_t>();
    if (number > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// A quantity given as a number (in `number_unit`, scaled by `scale`) or as a string parsed by
// `parse`.
template <typename Parse>
std::optional<int64_t> QuantityField(const Json& value, double scale, Parse parse) {
  if (value.is_number()) {
    const double number = value.get<double>();
    if (!std::isfinite(number) || number < 0 || number * scale > 1e15) return std::nullopt;
    return static_cast<int64_t>(std::llround(number * scale));
  }
  if (value.is_string()) {
    auto parsed = parse(value.get<std::string>());
    if (parsed) return static_cast<int64_t>(*parsed);
  }
  return std::nullopt;
}

Json OptionalJson(const auto& field) {
  return field ? Json(*field) : Json(nullptr);
}

std::string_view SampleStatusName(SampleStatus status) {
  switch (status) {
    case SampleStatus::kOk:
      return "ok";
    case SampleStatus::kGpuLost:
      return "gpu_lost";
    case SampleStatus::kUnknownGpu:
      return "unknown_gpu";
    case SampleStatus::kFailed:
      return "failed";
  }
  return "?";
}

Json SampleJson(const GpuSample& sample) {
  Json json;
  json["time_ms"] = sample.time;
  json["status"] = SampleStatusName(sample.status);
  if (!sample.error.empty()) json["error"] = sample.error;
  // null = not supported by this GPU or driver (never shown as 0)
  json["utilization_percent"] = OptionalJson(sample.utilization_percent);
  json["memory_used_mib"] = OptionalJson(sample.memory_used_mib);
  json["memory_free_mib"] = OptionalJson(sample.memory_free_mib);
  json["temperature_c"] = OptionalJson(sample.temperature_c);
  json["power_w"] = OptionalJson(sample.power_w);
  json["sm_clock_mhz"] = OptionalJson(sample.sm_clock_mhz);
  json["memory_clock_mhz"] = OptionalJson(sample.memory_clock_mhz);
  json["total_energy_mj"] = OptionalJson(sample.total_energy_mj);
  json["ecc_single_bit_volatile"] = OptionalJson(sample.ecc_single_bit_volatile);
  json["ecc_double_bit_volatile"] = OptionalJson(sample.ecc_double_bit_volatile);
  if (sample.remapped_rows) {
    json["remapped_rows"] = {{"correctable", sample.remapped_rows->correctable},
                             {"uncorrectable", sample.remapped_rows->uncorrectable},
                             {"pending", sample.remapped_rows->pending},
                             {"failure", sample.remapped_rows->failure}};
  } else {
    json["remapped_rows"] = nullptr;
  }
  json["throttle_reasons"] = OptionalJson(sample.throttle_reasons);
  json["process_ids"] = OptionalJson(sample.process_ids);
  if (!sample.warnings.empty()) json["warnings"] = sample.warnings;
  return json;
}

Json GpuToJson(const GpuView& view) {
  const GpuInfo& info = view.info;
  Json json;
  json["index"] = info.index;
  json["uuid"] = info.uuid;
  json["product_name"] = info.product_name;
  json["model"] = info.model;
  json["pci_bus_id"] = info.pci_bus_id;
  json["memory_total_mib"] = info.memory_total_mib;
  json["nvlink_island"] = info.nvlink_island;
  if (info.mig)
    json["mig"] = {{"parent_index", info.mig->parent_index},
                   {"parent_uuid", info.mig->parent_uuid},
                   {"profile", info.mig->profile},
                   {"gpu_instance_id", info.mig->gpu_instance_id},
                   {"compute_instance_id", info.mig->compute_instance_id}};
  json["power_limit_w"] = OptionalJson(info.power_limit_w);
  json["xid_events_supported"] = info.xid_events_supported;
  json["healthy"] = view.health.healthy;
  json["health_reasons"] = view.health.reasons;
  json["last_xid"] = OptionalJson(view.health.last_xid);
  json["workloads"] = view.workload_ids;
  json["jobs"] = view.job_ids;
  json["sample"] = SampleJson(view.sample);
  return json;
}

Json WorkloadToJson(const WorkloadView& view) {
  const WorkloadStatus& status = view.status;
  const WorkloadSpec& spec = view.spec;
  Json json;
  json["id"] = status.id;
  json["state"] = WorkloadStateName(status.state);
  json["job_id"] = spec.job_id;
  json["task_index"] = spec.task_index;
  json["argv"] = spec.argv;
  json["gpus"] = spec.gpu_indices;
  json["gpu_uuids"] = spec.gpu_uuids;
  if (spec.gpu_milli < kMilliPerGpu)
    json["gpu_share"] = {{"milli", spec.gpu_milli},
                         {"sharing", spec.gpu_sharing},
                         {"compute_percent", spec.gpu_compute_percent},
                         {"memory_limit_mib", spec.gpu_memory_limit_mib}};
  if (spec.run_as)
    json["run_as"] = {
        {"uid", spec.run_as->uid}, {"gid", spec.run_as->gid}, {"name", spec.run_as->name}};
  if (spec.isolation.mount_namespace)
    json["isolation"] = {{"mount_namespace", true},
                         {"hidden_devices", spec.isolation.hidden_devices}};
  json["cpu_milli"] = spec.cpu_milli;
  json["memory_mib"] = spec.memory_mib;
  json["grace_ms"] = spec.grace_period;
  json["max_runtime_ms"] = spec.max_runtime;
  json["adopted"] = view.adopted;
  json["pid"] = status.pid;
  json["pgid"] = status.pgid;
  json["shim_pid"] = status.shim_pid;
  json["exit_code"] = OptionalJson(status.exit_code);
  json["signal"] = OptionalJson(status.signal);
  json["signal_name"] = status.signal ? Json(SignalName(*status.signal)) : Json(nullptr);
  json["core_dumped"] = status.core_dumped;
  json["cancelled"] = status.cancelled;
  json["timed_out"] = status.timed_out;
  json["killed_after_grace"] = status.killed_after_grace;
  json["oom_killed"] = status.oom_killed;
  json["started_at_ms"] = status.started_at_ms;
  json["finished_at_ms"] = status.finished_at_ms;
  json["error"] = status.error;
  json["cgroup_version"] = CgroupVersionName(status.cgroup_version);
  json["cgroup_paths"] = status.cgroup_paths;
  json["limits_applied"] = status.limits_applied;
  json["limits_warning"] = status.limits_warning;
  json["stdout_log"] = status.stdout_log;
  json["stderr_log"] = status.stderr_log;
  json["log_bytes_dropped"] = status.log_bytes_dropped;
  json["user_cpu_ms"] = status.user_cpu_ms;
  json["system_cpu_ms"] = status.system_cpu_ms;
  json["max_rss_kib"] = status.max_rss_kib;
  return json;
}

net::HttpResponse HandleHealth(const AgentCore& core, const AgentApiOptions& options) {
  const AgentSnapshot snapshot = core.Snapshot();
  Json unhealthy = Json::array();
  for (const GpuView& gpu : snapshot.gpus)
    if (!gpu.health.healthy)
      unhealthy.push_back({{"index", gpu.info.index}, {"reasons", gpu.health.reasons}});
  const bool sampling = core.SamplerHealthy();
  Json json;
  json["status"] = sampling ? "ok" : "sampling stalled";
  json["gpu_sharing"] = GpuSharingModeName(core.gpu_sharing());
  json["workload_user"] = core.DescribeWorkloadUser();
  json["workload_isolation"] = core.DescribeWorkloadIsolation();
  json["version"] = kVersion;
  json["hostname"] = snapshot.hostname;
  json["backend"] = snapshot.backend;
  json["driver_version"] = snapshot.driver_version;
  json["standalone"] = options.standalone;
  json["api_authentication"] =
      options.api_key.empty() ? "none (standalone: loopback only)" : "agent key";
  if (options.control_loop) {
    const ControlLoopStatus loop = options.control_loop->Status();
    json["control_plane"] = {{"server", options.control_loop->options().server_url},
                             {"connected", loop.connected},
                             {"last_sync_ms", loop.last_sync_ms},
                             {"known_version", loop.known_version},
                             {"error", loop.last_error}};
  }
  json["gpus"] = snapshot.gpus.size();
  json["healthy_gpus"] = snapshot.gpus.size() - unhealthy.size();
  json["unhealthy_gpus"] = std::move(unhealthy);
  json["last_sample_ms"] = snapshot.last_sample_ms;
  json["sample_interval_ms"] = core.sample_interval_ms();
  json["data_dir"] = core.data_dir();
  return JsonResponse(sampling ? 200 : 503, json);
}

net::HttpResponse HandleGpus(const AgentCore& core) {
  const AgentSnapshot snapshot = core.Snapshot();
  Json json;
  json["hostname"] = snapshot.hostname;
  json["backend"] = snapshot.backend;
  json["driver_version"] = snapshot.driver_version;
  json["last_sample_ms"] = snapshot.last_sample_ms;
  json["problems"] = snapshot.problems;
  Json gpus = Json::array();
  for (const GpuView& gpu : snapshot.gpus)
    gpus.push_back(GpuToJson(gpu));
  json["gpus"] = std::move(gpus);
  return JsonResponse(200, json);
}

// A non-negative integer query parameter; nothing when absent, an error response when bad.
std::optional<int64_t> CountParam(const net::HttpRequest& request, const std::string& name,
                                  std::optional<net::HttpResponse>& refusal) {
  auto text = request.Query(name);
  if (!text) return std::nullopt;
  int64_t value = 0;
  auto [end, status] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (text->empty() || status != std::errc() || end != text->data() + text->size() || value < 0)
    refusal = net::HttpResponse::Error(
        400, fmt::format("{} must be a non-negative integer, not '{}'", name, *text));
  return value;
}

net::HttpResponse HandleLogs(const AgentCore& core, const net::HttpRequest& request) {
  std::optional<net::HttpResponse> refusal;
  const std::optional<int64_t> tail = CountParam(request, "tail", refusal);
  const std::optional<int64_t> offset = CountParam(request, "offset", refusal);
  if (refusal) return *refusal;
  if (tail && offset) return net::HttpResponse::Error(400, "give tail or offset, not both");
  const std::string stream = request.Query("stream").value_or("stdout");
  if (offset) {
    // Offsets (docs/api.md, Logs): what the server proxies for `gpufleet logs -f`.
    auto chunk = core.LogsFrom(request.PathParam("id"), stream, *offset);
    if (!chunk.ok()) return ErrorResponse(chunk.error());
    net::HttpResponse response = net::HttpResponse::Text(200, std::move(chunk.value().data));
    response.headers.emplace_back("X-Log-Next-Offset", std::to_string(chunk.value().next_offset));
    response.headers.emplace_back("X-Log-Finished", chunk.value().finished ? "true" : "false");
    if (chunk.value().skipped > 0)
      response.headers.emplace_back("X-Log-Skipped", std::to_string(chunk.value().skipped));
    return response;
  }
  auto logs = core.Logs(request.PathParam("id"), stream, tail);
  if (!logs.ok()) return ErrorResponse(logs.error());
  return net::HttpResponse::Text(200, std::move(logs).value());
}

}  // namespace

AgentResult<LaunchRequest> ParseLaunchRequest(std::string_view text) {
  static const std::set<std::string> kKnown = {"id",     "job_id",  "task_index", "argv",
                                               "env",    "workdir", "gpus",       "cpu",
                                               "memory", "grace",   "max_runtime"};
  AgentError error;
  auto body = ParseObject(text, kKnown, false, error);
  if (!body) return error;
  LaunchRequest request;
  if (!body->contains("argv")) return BadRequest("'argv' is required: the command to run");
  for (const auto& [key, value] : body->items()) {
    if (key == "id") {
      if (!value.is_string()) return BadRequest("'id' must be a string");
      request.id = value.get<std::string>();
      if (request.id.empty()) return BadRequest("'id' must not be empty (leave it out instead)");
    } else if (key == "job_id") {
      auto number = IntegerField(value);
      if (!number || *number < 0) return BadRequest("'job_id' must be a non-negative integer");
      request.job_id = static_cast<JobId>(*number);
    } else if (key == "task_index") {
      auto number = IntegerField(value);
      if (!number || *number < 0 || *number > INT32_MAX)
        return BadRequest("'task_index' must be a non-negative integer");
      request.task_index = static_cast<int32_t>(*number);
    } else if (key == "argv") {
      if (!value.is_array() || value.empty())
        return BadRequest("'argv' must be a non-empty array of strings");
      for (const Json& arg : value) {
        if (!arg.is_string()) return BadRequest("'argv' must be a non-empty array of strings");
        request.argv.push_back(arg.get<std::string>());
      }
    } else if (key == "env") {
      if (!value.is_object()) return BadRequest("'env' must be an object of strings");
      for (const auto& [name, entry] : value.items()) {
        if (!entry.is_string()) return BadRequest(fmt::format("'env.{}' must be a string", name));
        request.env[name] = entry.get<std::string>();
      }
    } else if (key == "workdir") {
      if (!value.is_string()) return BadRequest("'workdir' must be a string (an absolute path)");
      request.workdir = value.get<std::string>();
    } else if (key == "gpus") {
      if (value.is_array()) {
        std::vector<int32_t> indices;
        for (const Json& entry : value) {
          auto index = IntegerField(entry);
          if (!index || *index < 0 || *index > INT32_MAX)
            return BadRequest("'gpus' must be a count or a list of GPU indices (integers >= 0)");
          indices.push_back(static_cast<int32_t>(*index));
        }
        request.gpu_indices = std::move(indices);
      } else {
        auto count = IntegerField(value);
        if (!count || *count < 0 || *count > INT32_MAX)
          return BadRequest("'gpus' must be a count or a list of GPU indices (integers >= 0)");
        request.gpu_count = static_cast<int32_t>(*count);
      }
    } else if (key == "cpu") {
      auto milli = QuantityField(value, 1000, ParseCpuMilli);
      if (!milli) return BadRequest("'cpu' must be cores as a number (0.5) or a string (\"500m\")");
      request.cpu_milli = *milli;
    } else if (key == "memory") {
      auto mib = QuantityField(value, 1, ParseMemoryMib);
      if (!mib)
        return BadRequest("'memory' must be MiB as a number or a string (\"512Mi\", \"2Gi\")");
      request.memory_mib = *mib;
    } else if (key == "grace" || key == "max_runtime") {
      auto ms = QuantityField(value, 1000, ParseDurationMs);
      if (!ms)
        return BadRequest(fmt::format(
            "'{}' must be seconds as a number or a duration string (\"30s\", \"500ms\")", key));
      (key == "grace" ? request.grace_period_ms : request.max_runtime_ms) = *ms;
    }
  }
  return request;
}

AgentResult<SimFault> ParseFaultRequest(std::string_view text) {
  static const std::set<std::string> kKnown = {"gpu", "kind", "code"};
  AgentError error;
  auto body = ParseObject(text, kKnown, false, error);
  if (!body) return error;
  SimFault fault;
  if (!body->contains("gpu")) return BadRequest("'gpu' is required: the GPU index");
  auto gpu = IntegerField((*body)["gpu"]);
  if (!gpu || *gpu < 0 || *gpu > INT32_MAX) return BadRequest("'gpu' must be a GPU index");
  fault.gpu = static_cast<int32_t>(*gpu);
  const auto kinds = SimFaultKindNames();
  if (!body->contains("kind") || !(*body)["kind"].is_string())
    return BadRequest(fmt::format("'kind' is required, one of {}", fmt::join(kinds, ", ")));
  const std::string kind = (*body)["kind"].get<std::string>();
  auto parsed = ParseSimFaultKind(kind);
  if (!parsed)
    return BadRequest(
        fmt::format("unknown fault kind '{}' (known: {})", kind, fmt::join(kinds, ", ")));
  fault.kind = *parsed;
  if (body->contains("code")) {
    auto code = IntegerField((*body)["code"]);
    if (!code) return BadRequest("'code' must be an integer");
    fault.code = *code;
  }
  return fault;
}

std::string WorkloadJson(const WorkloadView& view) {
  return WorkloadToJson(view).dump(2);
}

std::string GpuJson(const GpuView& view) {
  return GpuToJson(view).dump(2);
}

std::optional<ListenAddress> ParseListenAddress(std::string_view text, std::string& error) {
  ListenAddress address;
  std::string_view port_text = text;
  address.host = "127.0.0.1";
  if (size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    std::string_view host = text.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    if (host == "localhost") host = "127.0.0.1";
    if (!host.empty()) address.host = std::string(host);
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [end, status] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || status != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    error = fmt::format("--listen '{}': expected HOST:PORT such as 127.0.0.1:9400", text);
    return std::nullopt;
  }
  address.port = static_cast<uint16_t>(port);
  return address;
}

std::string NewApiKey() {
  return "gpa_" + net::RandomHex(32);
}

std::optional<std::string> WriteApiKeyFile(const std::string& path, const std::string& key) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("cannot write {}: {}", temporary, std::strerror(errno));
  const std::string line = key + "\n";
  const bool written = ::fchmod(fd, 0600) == 0 &&
                       ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int saved = errno;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    return fmt::format("cannot write {}: {}", path, std::strerror(written ? errno : saved));
  }
  return std::nullopt;
}

std::optional<std::string> ReadApiKeyFile(const std::string& path, std::string& error) {
  std::ifstream in(path);
  std::string key;
  if (!in || !std::getline(in, key)) {
    error = fmt::format("cannot read the agent's API key from {}", path);
    return std::nullopt;
  }
  while (!key.empty() && (key.back() == '\r' || key.back() == ' '))
    key.pop_back();
  if (key.empty()) {
    error = fmt::format("{} holds no API key", path);
    return std::nullopt;
  }
  return key;
}

net::Router MakeAgentRouter(AgentCore& core, AgentApiOptions options) {
  net::Router router;
  // Refused calls, by reason, for /metrics.
  struct Refusals {
    std::atomic<uint64_t> missing{0};
    std::atomic<uint64_t> wrong{0};
  };
  auto refusals = std::make_shared<Refusals>();
  // Every /v1 route goes through this: only the holder of the key (the control plane, or root
  // on the node through the key file) may start, stop or read workloads.
  auto add = [&router, refusals, key = options.api_key](
                 std::string method, std::string_view pattern, net::HttpHandler handler) {
    if (key.empty()) return router.Add(std::move(method), pattern, std::move(handler));
    router.Add(std::move(method), pattern,
               [refusals, key, handler = std::move(handler)](const net::HttpRequest& request) {
                 const auto presented = net::BearerToken(request.Header("Authorization"));
                 if (!presented) {
                   ++refusals->missing;
                   net::HttpResponse refusal = net::HttpResponse::Error(
                       401,
                       "this agent is managed by a control plane: its API needs the agent's key "
                       "(Authorization: Bearer; on the node, the key file in the data dir)");
                   refusal.headers.emplace_back("WWW-Authenticate", "Bearer");
                   return refusal;
                 }
                 if (!net::ConstantTimeEquals(*presented, key)) {
                   ++refusals->wrong;
                   return net::HttpResponse::Error(401, "wrong agent API key");
                 }
                 return handler(request);
               });
  };
  router.Add("GET", "/healthz",
             [&core, options](const net::HttpRequest&) { return HandleHealth(core, options); });
  router.Add(
      "GET", "/metrics",
      [&core, refusals, authenticated = !options.api_key.empty(),
       http_counters = options.http_counters](const net::HttpRequest&) {
        std::string text = core.MetricsText();
        if (http_counters) text += net::HttpCountersMetricsText(*http_counters, "gpufleet_agent");
        if (authenticated)
          text += fmt::format(
              "# HELP gpufleet_agent_api_refused_total Calls to the agent's /v1 API refused, by "
              "reason.\n"
              "# TYPE gpufleet_agent_api_refused_total counter\n"
              "gpufleet_agent_api_refused_total{{reason=\"no_credentials\"}} {}\n"
              "gpufleet_agent_api_refused_total{{reason=\"wrong_key\"}} {}\n",
              refusals->missing.load(), refusals->wrong.load());
        return net::HttpResponse::Text(200, std::move(text), std::string(kPrometheusContentType));
      });
  add("GET", "/v1/gpus", [&core](const net::HttpRequest&) { return HandleGpus(core); });
  add("POST", "/v1/workloads", [&core](const net::HttpRequest& request) {
    auto parsed = ParseLaunchRequest(request.body);
    if (!parsed.ok()) return ErrorResponse(parsed.error());
    auto launched = core.Launch(parsed.value());
    if (!launched.ok()) return ErrorResponse(launched.error());
    net::HttpResponse response = JsonResponse(201, WorkloadToJson(launched.value()));
    response.headers.emplace_back("Location", "/v1/workloads/" + launched.value().status.id);
    return response;
  });
  add("GET", "/v1/workloads", [&core](const net::HttpRequest&) {
    Json workloads = Json::array();
    for (const WorkloadView& view : core.List())
      workloads.push_back(WorkloadToJson(view));
    return JsonResponse(200, Json{{"workloads", std::move(workloads)}});
  });
  add("GET", "/v1/workloads/{id}", [&core](const net::HttpRequest& request) {
    auto view = core.Get(request.PathParam("id"));
    if (!view.ok()) return ErrorResponse(view.error());
    return JsonResponse(200, WorkloadToJson(view.value()));
  });
  add("POST", "/v1/workloads/{id}/cancel", [&core](const net::HttpRequest& request) {
    AgentError error;
    auto body = ParseObject(request.body, {"grace"}, true, error);
    if (!body) return ErrorResponse(error);
    std::optional<TimeMs> grace;
    if (body->contains("grace")) {
      grace = QuantityField((*body)["grace"], 1000, ParseDurationMs);
      if (!grace)
        return net::HttpResponse::Error(
            400, "'grace' must be seconds as a number or a duration string (\"30s\", \"0s\")");
    }
    auto view = core.Cancel(request.PathParam("id"), grace);
    if (!view.ok()) return ErrorResponse(view.error());
    return JsonResponse(200, WorkloadToJson(view.value()));
  });
  add("GET", "/v1/workloads/{id}/logs",
      [&core](const net::HttpRequest& request) { return HandleLogs(core, request); });
  add("POST", "/v1/sim/faults", [&core](const net::HttpRequest& request) {
    if (!core.simulated())
      return net::HttpResponse::Error(
          409, fmt::format("fault injection needs simulated GPUs (--sim-gpus); this agent uses "
                           "the {} backend",
                           core.backend_name()));
    auto fault = ParseFaultRequest(request.body);
    if (!fault.ok()) return ErrorResponse(fault.error());
    auto gpu = core.InjectFault(fault.value());
    if (!gpu.ok()) return ErrorResponse(gpu.error());
    return JsonResponse(200, GpuToJson(gpu.value()));
  });
  return router;
}

}  // namespace gpufleet::agent
