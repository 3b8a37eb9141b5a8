#include "agent/executor_files.h"

#include <cerrno>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/executor_util.h"

namespace gpufleet::agent::executor_internal {

using nlohmann::json;

WorkloadPaths WorkloadPaths::For(const std::string& workload_dir) {
  WorkloadPaths paths;
  paths.dir = workload_dir;
  paths.spec = workload_dir + "/spec.json";
  paths.shim_pid = workload_dir + "/shim.pid";
  paths.workload_pgid = workload_dir + "/workload.pgid";
  paths.cancel = workload_dir + "/cancel.json";
  paths.status = workload_dir + "/status.json";
  paths.stdout_log = workload_dir + "/stdout.log";
  paths.stderr_log = workload_dir + "/stderr.log";
  paths.shim_log = workload_dir + "/shim.log";
  paths.default_workdir = workload_dir + "/work";
  paths.tmp = workload_dir + "/tmp";
  paths.phase = workload_dir + "/phase";
  paths.bundle = workload_dir + "/bundle";
  paths.rootfs = workload_dir + "/rootfs";
  paths.upper = workload_dir + "/upper";
  paths.overlay_work = workload_dir + "/overlay-work";
  return paths;
}

namespace {

json MountsToJson(const std::vector<ContainerMount>& mounts) {
  json list = json::array();
  for (const ContainerMount& mount : mounts)
    list.push_back(
        {{"source", mount.source}, {"target", mount.target}, {"read_only", mount.read_only}});
  return list;
}

json WorkloadToJson(const WorkloadSpec& spec) {
  return json{{"id", spec.id},
              {"job_id", spec.job_id},
              {"task_index", spec.task_index},
              {"argv", spec.argv},
              {"env", spec.env},
              {"workdir", spec.workdir},
              {"gpu_indices", spec.gpu_indices},
              {"gpu_uuids", spec.gpu_uuids},
              {"gpu_milli", spec.gpu_milli},
              {"gpu_sharing", spec.gpu_sharing},
              {"gpu_compute_percent", spec.gpu_compute_percent},
              {"gpu_memory_limit_mib", spec.gpu_memory_limit_mib},
              {"cpu_milli", spec.cpu_milli},
              {"memory_mib", spec.memory_mib},
              {"grace_period_ms", spec.grace_period},
              {"max_runtime_ms", spec.max_runtime},
              {"log_rotate_bytes", spec.logs.rotate_bytes},
              {"log_keep_files", spec.logs.keep_files},
              {"log_max_line_bytes", spec.logs.max_line_bytes},
              {"run_as", spec.run_as ? json{{"uid", spec.run_as->uid},
                                            {"gid", spec.run_as->gid},
                                            {"groups", spec.run_as->groups},
                                            {"name", spec.run_as->name}}
                                     : json(nullptr)},
              {"isolation",
               {{"mount_namespace", spec.isolation.mount_namespace},
                {"hidden_devices", spec.isolation.hidden_devices},
                {"keep_visible", spec.isolation.keep_visible}}},
              {"container",
               {{"image", spec.container.image},
                {"mounts", MountsToJson(spec.container.mounts)},
                {"user", spec.container.user}}},
              {"cdi_devices", spec.cdi_devices}};
}

void WorkloadFromJson(const json& object, WorkloadSpec& spec) {
  object.at("id").get_to(spec.id);
  object.at("job_id").get_to(spec.job_id);
  object.at("task_index").get_to(spec.task_index);
  object.at("argv").get_to(spec.argv);
  object.at("env").get_to(spec.env);
  object.at("workdir").get_to(spec.workdir);
  object.at("gpu_indices").get_to(spec.gpu_indices);
  object.at("gpu_uuids").get_to(spec.gpu_uuids);
  // Absent in specs written before GPUs could be shared: those held their GPUs whole.
  spec.gpu_milli = object.value("gpu_milli", kMilliPerGpu);
  // Absent in specs written before shares had limits.
  spec.gpu_sharing = object.value("gpu_sharing", std::string());
  spec.gpu_compute_percent = object.value("gpu_compute_percent", 0);
  spec.gpu_memory_limit_mib = object.value("gpu_memory_limit_mib", std::vector<MiB>());
  object.at("cpu_milli").get_to(spec.cpu_milli);
  object.at("memory_mib").get_to(spec.memory_mib);
  object.at("grace_period_ms").get_to(spec.grace_period);
  object.at("max_runtime_ms").get_to(spec.max_runtime);
  object.at("log_rotate_bytes").get_to(spec.logs.rotate_bytes);
  object.at("log_keep_files").get_to(spec.logs.keep_files);
  // Absent in specs written before lines were capped: those were not.
  spec.logs.max_line_bytes = object.value("log_max_line_bytes", int64_t{0});
  // Absent in specs written before workloads could run as another user.
  if (auto run_as = object.find("run_as"); run_as != object.end() && run_as->is_object()) {
    WorkloadUser user;
    run_as->at("uid").get_to(user.uid);
    run_as->at("gid").get_to(user.gid);
    run_as->at("groups").get_to(user.groups);
    run_as->at("name").get_to(user.name);
    spec.run_as = std::move(user);
  }
  // Absent in specs written before workloads had mount namespaces.
  if (auto isolation = object.find("isolation");
      isolation != object.end() && isolation->is_object()) {
    isolation->at("mount_namespace").get_to(spec.isolation.mount_namespace);
    isolation->at("hidden_devices").get_to(spec.isolation.hidden_devices);
    isolation->at("keep_visible").get_to(spec.isolation.keep_visible);
  }
  // Absent in specs written before containers.
  if (auto container = object.find("container");
      container != object.end() && container->is_object()) {
    container->at("image").get_to(spec.container.image);
    container->at("user").get_to(spec.container.user);
    for (const json& mount : container->at("mounts"))
      spec.container.mounts.push_back({mount.at("source").get<std::string>(),
                                       mount.at("target").get<std::string>(),
                                       mount.at("read_only").get<bool>()});
    object.at("cdi_devices").get_to(spec.cdi_devices);
  }
}

template <typename T>
json Optional(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

template <typename T>
void GetOptional(const json& object, const char* key, std::optional<T>& value) {
  const json& item = object.at(key);
  value = item.is_null() ? std::nullopt : std::optional<T>(item.get<T>());
}

// nlohmann reports bad input by throwing; nothing may escape into the executor or the shim.
template <typename Fill>
std::optional<std::string> ParseWith(const std::string& text, Fill fill) {
  try {
    json object = json::parse(text);
    if (!object.is_object()) return "not a JSON object";
    if (object.value("format", 0) != kStateFormat)
      return fmt::format("format {} is not {}", object.value("format", 0), kStateFormat);
    fill(object);
    return std::nullopt;
  } catch (const json::exception& error) {
    return error.what();
  }
}

}  // namespace

std::string ToJson(const ShimSpec& spec) {
  json object{{"format", kStateFormat},
              {"workload", WorkloadToJson(spec.workload)},
              {"workload_dir", spec.workload_dir},
              {"workdir", spec.workdir},
              {"env", spec.env},
              {"cgroup_version", CgroupVersionName(spec.cgroup.version)},
              {"cgroup_dirs", spec.cgroup.dirs},
              {"limits_applied", spec.limits_applied},
              {"limits_warning", spec.limits_warning},
              {"created_at_ms", spec.created_at_ms}};
  if (!spec.container_id.empty()) {
    const ContainerRuntimeConfig& containers = spec.containers;
    object["container_id"] = spec.container_id;
    object["containers"] = {{"runtime", containers.runtime},
                            {"init", containers.init},
                            {"image_cache_dir", containers.images.dir},
                            {"image_cache_max_bytes", containers.images.max_bytes},
                            {"podman", containers.images.podman},
                            {"prepare_timeout_ms", containers.images.prepare_timeout_ms},
                            {"cdi_dirs", containers.cdi_dirs}};
  }
  return object.dump(2) + "\n";
}

std::optional<std::string> ParseShimSpec(const std::string& text, ShimSpec& spec) {
  return ParseWith(text, [&](const json& object) {
    WorkloadFromJson(object.at("workload"), spec.workload);
    object.at("workload_dir").get_to(spec.workload_dir);
    object.at("workdir").get_to(spec.workdir);
    object.at("env").get_to(spec.env);
    auto version = ParseCgroupVersion(object.at("cgroup_version").get<std::string>());
    spec.cgroup.version = version.value_or(CgroupVersion::kNone);
    object.at("cgroup_dirs").get_to(spec.cgroup.dirs);
    object.at("limits_applied").get_to(spec.limits_applied);
    object.at("limits_warning").get_to(spec.limits_warning);
    object.at("created_at_ms").get_to(spec.created_at_ms);
    if (auto id = object.find("container_id"); id != object.end()) {
      id->get_to(spec.container_id);
      const json& containers = object.at("containers");
      containers.at("runtime").get_to(spec.containers.runtime);
      containers.at("init").get_to(spec.containers.init);
      containers.at("image_cache_dir").get_to(spec.containers.images.dir);
      containers.at("image_cache_max_bytes").get_to(spec.containers.images.max_bytes);
      containers.at("podman").get_to(spec.containers.images.podman);
      containers.at("prepare_timeout_ms").get_to(spec.containers.images.prepare_timeout_ms);
      containers.at("cdi_dirs").get_to(spec.containers.cdi_dirs);
    }
  });
}

std::string ToJson(const ProcessRecord& record) {
  json object{{"format", kStateFormat},
              {"pid", record.pid},
              {"start_ticks", record.start_ticks},
              {"started_at_ms", record.started_at_ms}};
  return object.dump() + "\n";
}

std::optional<std::string> ParseProcessRecord(const std::string& text, ProcessRecord& record) {
  return ParseWith(text, [&](const json& object) {
    object.at("pid").get_to(record.pid);
    object.at("start_ticks").get_to(record.start_ticks);
    object.at("started_at_ms").get_to(record.started_at_ms);
  });
}

std::string ToJson(const FinalStatus& status) {
  json object{{"format", kStateFormat},
              {"state", WorkloadStateName(status.state)},
              {"pid", status.pid},
              {"exit_code", Optional(status.exit_code)},
              {"signal", Optional(status.signal)},
              {"core_dumped", status.core_dumped},
              {"cancelled", status.cancelled},
              {"timed_out", status.timed_out},
              {"killed_after_grace", status.killed_after_grace},
              {"oom_killed", status.oom_killed},
              {"started_at_ms", status.started_at_ms},
              {"finished_at_ms", status.finished_at_ms},
              {"error", status.error},
              {"user_cpu_ms", status.user_cpu_ms},
              {"system_cpu_ms", status.system_cpu_ms},
              {"max_rss_kib", status.max_rss_kib},
              {"log_bytes_dropped", status.log_bytes_dropped},
              {"cleanup_warning", status.cleanup_warning}};
  return object.dump(2) + "\n";
}

std::optional<std::string> ParseFinalStatus(const std::string& text, FinalStatus& status) {
  std::optional<std::string> bad_state;
  auto error = ParseWith(text, [&](const json& object) {
    auto state = ParseWorkloadState(object.at("state").get<std::string>());
    if (!state || (*state != WorkloadState::kExited && *state != WorkloadState::kFailedToStart))
      bad_state = fmt::format("state '{}' is not final", object.at("state").get<std::string>());
    else
      status.state = *state;
    object.at("pid").get_to(status.pid);
    GetOptional(object, "exit_code", status.exit_code);
    GetOptional(object, "signal", status.signal);
    object.at("core_dumped").get_to(status.core_dumped);
    object.at("cancelled").get_to(status.cancelled);
    object.at("timed_out").get_to(status.timed_out);
    object.at("killed_after_grace").get_to(status.killed_after_grace);
    object.at("oom_killed").get_to(status.oom_killed);
    object.at("started_at_ms").get_to(status.started_at_ms);
    object.at("finished_at_ms").get_to(status.finished_at_ms);
    object.at("error").get_to(status.error);
    object.at("user_cpu_ms").get_to(status.user_cpu_ms);
    object.at("system_cpu_ms").get_to(status.system_cpu_ms);
    object.at("max_rss_kib").get_to(status.max_rss_kib);
    object.at("log_bytes_dropped").get_to(status.log_bytes_dropped);
    object.at("cleanup_warning").get_to(status.cleanup_warning);
  });
  return error ? error : bad_state;
}

std::string ToJson(const CancelRequest& request) {
  json object{{"format", kStateFormat},
              {"requested_at_ms", request.requested_at_ms},
              {"grace_ms", request.grace_ms}};
  return object.dump() + "\n";
}

std::optional<std::string> ParseCancelRequest(const std::string& text, CancelRequest& request) {
  return ParseWith(text, [&](const json& object) {
    object.at("requested_at_ms").get_to(request.requested_at_ms);
    object.at("grace_ms").get_to(request.grace_ms);
  });
}

namespace {
std::optional<std::string> ParseAny(const std::string& text, ShimSpec& value) {
  return ParseShimSpec(text, value);
}
std::optional<std::string> ParseAny(const std::string& text, ProcessRecord& value) {
  return ParseProcessRecord(text, value);
}
std::optional<std::string> ParseAny(const std::string& text, FinalStatus& value) {
  return ParseFinalStatus(text, value);
}
std::optional<std::string> ParseAny(const std::string& text, CancelRequest& value) {
  return ParseCancelRequest(text, value);
}
}  // namespace

template <typename T>
std::optional<std::string> LoadStateFile(const std::string& path, T& value, bool& exists) {
  exists = false;
  auto text = ReadFileToString(path);
  if (!text) {
    if (errno == ENOENT) return std::nullopt;
    return fmt::format("read '{}': {}", path, ErrnoText(errno));
  }
  exists = true;
  if (auto error = ParseAny(*text, value)) return fmt::format("'{}': {}", path, *error);
  return std::nullopt;
}

template std::optional<std::string> LoadStateFile(const std::string&, ShimSpec&, bool&);
template std::optional<std::string> LoadStateFile(const std::string&, ProcessRecord&, bool&);
template std::optional<std::string> LoadStateFile(const std::string&, FinalStatus&, bool&);
template std::optional<std::string> LoadStateFile(const std::string&, CancelRequest&, bool&);

}  // namespace gpufleet::agent::executor_internal
