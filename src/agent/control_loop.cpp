#include "agent/control_loop.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/readiness.h"
#include "api/json.h"
#include "api/types.h"
#include "core/version.h"
#include "net/http_client.h"
#include "net/server_urls.h"

namespace gpufleet::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TimeMs WallClockMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Active(WorkloadState state) {
  return state == WorkloadState::kStarting || state == WorkloadState::kRunning;
}

bool Ended(const WorkloadStatus& status) {
  return status.Finished() || status.state == WorkloadState::kLost;
}

// Why `port` on `address` cannot be listened on (another program holds it), or nothing.
std::optional<std::string> PortInUse(const std::string& address, int32_t port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof *v4;
  } else if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof *v6;
  } else {
    return std::nullopt;  // a name, not an address: the replica's own bind will say
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  std::optional<std::string> busy;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 && errno == EADDRINUSE)
    busy = std::strerror(errno);
  ::close(fd);
  return busy;
}

// This machine's CPUs and memory, as the scheduler may hand them out.
MilliCpu MachineCpuMilli() {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? static_cast<MilliCpu>(cpus) * 1000 : 0;
}

MiB MachineMemoryMib() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<MiB>((static_cast<int64_t>(pages) * page_size) >> 20);
}

// Read by the detached thread that makes an HTTP call and by the loop that waits for it, so that
// Stop() need not wait for a long poll: the call owns copies of all it uses and this state,
// which outlives the loop when it must.
struct Wakeup {
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
};

struct PendingCall {
  bool done = false;  // under Wakeup::mutex
  net::HttpResult result;
  Clock::time_point sent = Clock::now();
};

}  // namespace

struct ControlLoop::State {
  AgentCore& core;
  ControlLoopOptions options;
  std::optional<net::ServerUrls> servers;  // the server, or servers of which one leads
  std::string SyncUrl() const { return servers->current() + std::string(kSyncPath); }
  std::shared_ptr<Wakeup> wakeup = std::make_shared<Wakeup>();
  std::thread thread;
  MilliCpu cpu_milli = MachineCpuMilli();
  MiB memory_mib = MachineMemoryMib();

  mutable std::mutex status_mutex;
  ControlLoopStatus status;  // under status_mutex

  // The loop thread's own state.
  uint64_t known_version = 0;
  std::vector<api::TaskLaunch> desired;  // the latest answer's
  TimeMs heartbeat_ms = 0;
  std::map<std::string, int32_t> attempts;  // workload id -> attempt, from the desired tasks
  // Launches that failed before anything was on disk: reported until the server drops the task.
  std::map<std::string, api::WorkloadReport> launch_failures;
  // Desired tasks waiting for GPUs that a cancelled workload still holds.
  std::set<std::string> deferred;
  std::set<std::string> cancel_sent;
  std::set<std::string> forget_failed;          // logged once each
  std::map<std::string, std::string> reported;  // id -> state in the latest sync sent
  std::string logged_error;                     // the last error logged
  Clock::time_point last_gc{};
  // Deployments' replicas: their readiness probes (each desired task with a port).
  ReadinessProber readiness;

  State(AgentCore& core_ref, ControlLoopOptions opts) : core(core_ref), options(std::move(opts)) {}

  void Log(const std::string& message) const {
    if (options.log)
      options.log(message);
    else
      LogToStderr(message);
  }
  bool Stopping() const {
    std::lock_guard lock(wakeup->mutex);
    return wakeup->stopping;
  }
  // Sleeps unless stopped first; false when stopping.
  bool SleepFor(TimeMs ms) {
    std::unique_lock lock(wakeup->mutex);
    wakeup->changed.wait_for(lock, milliseconds(ms), [&] { return wakeup->stopping; });
    return !wakeup->stopping;
  }

  void Run();
  api::SyncRequest BuildRequest(int32_t wait_ms);
  api::WorkloadReport ReportOf(const WorkloadView& view) const;
  std::shared_ptr<PendingCall> Send(const api::SyncRequest& request, TimeMs timeout_ms);
  template <typename Tick>
  bool Await(const std::shared_ptr<PendingCall>& call, Tick tick);
  std::optional<api::SyncResponse> Answer(const PendingCall& call, std::string& error) const;
  void NoteError(const std::string& error);
  void NoteSuccess();
  bool Apply();
  bool LaunchTask(const api::TaskLaunch& task, const std::vector<WorkloadView>& views);
  void CollectGarbage(const std::vector<WorkloadView>& views, const std::set<std::string>& wanted);
  bool WorkloadsChanged();
  void ShortSync();
};

api::WorkloadReport ControlLoop::State::ReportOf(const WorkloadView& view) const {
  const WorkloadStatus& workload = view.status;
  api::WorkloadReport report;
  report.workload_id = workload.id;
  report.job_id = view.spec.job_id;
  report.rank = view.spec.task_index;
  if (auto found = attempts.find(workload.id); found != attempts.end()) {
    report.attempt = found->second;
  } else if (auto env = view.spec.env.find("GPUFLEET_ATTEMPT"); env != view.spec.env.end()) {
    // After an agent restart, before the server's first answer: the server put it there.
    try {
      report.attempt = std::stoi(env->second);
    } catch (const std::exception&) {
    }
  }
  report.state = std::string(WorkloadStateName(workload.state));
  report.ready = workload.state == WorkloadState::kRunning && readiness.Ready(workload.id);
  report.exit_code = workload.exit_code;
  report.signal = workload.signal;
  report.error = workload.error;
  if (workload.state == WorkloadState::kExited && report.error.empty()) {
    // How it ended beyond the code, for the job's reason.
    if (workload.oom_killed)
      report.error = "out of memory (OOM-killed)";
    else if (workload.timed_out)
      report.error = "stopped after its max_runtime";
  }
  report.started_ms = workload.started_at_ms;
  report.finished_ms = workload.finished_at_ms;
  return report;
}

api::SyncRequest ControlLoop::State::BuildRequest(int32_t wait_ms) {
  api::SyncRequest request;
  request.agent_key = options.api_key;
  api::NodeReport& node = request.node;
  node.name = options.node_name.empty() ? core.hostname() : options.node_name;
  node.address = options.address;
  node.agent_url = options.agent_url;
  node.backend = std::string(core.backend_name());
  node.rack = options.rack;
  node.spine = options.spine;
  node.agent_version = kVersion;
  node.cpu_milli = cpu_milli;
  node.memory_mib = memory_mib;
  for (const GpuView& gpu : core.Snapshot().gpus) {
    api::GpuStatus reported_gpu;
    reported_gpu.index = gpu.info.index;
    reported_gpu.uuid = gpu.info.uuid;
    reported_gpu.model = gpu.info.model;
    reported_gpu.memory_mib = gpu.info.memory_total_mib;
    reported_gpu.nvlink_island = gpu.info.nvlink_island;
    reported_gpu.healthy = gpu.health.healthy;
    if (!gpu.health.healthy) reported_gpu.health_reason = gpu.health.Reason();
    reported_gpu.utilization_pct = gpu.sample.utilization_percent.value_or(0);
    reported_gpu.memory_used_mib = gpu.sample.memory_used_mib.value_or(0);
    reported_gpu.temperature_c = gpu.sample.temperature_c.value_or(0);
    reported_gpu.power_w = gpu.sample.power_w.value_or(0);
    node.gpus.push_back(std::move(reported_gpu));
  }
  std::map<std::string, std::string> states;
  for (const WorkloadView& view : core.List()) {
    if (view.spec.job_id == 0) continue;  // not the server's: `agent run` and the local API
    request.workloads.push_back(ReportOf(view));
    states[view.status.id] = request.workloads.back().state;
  }
  for (const auto& [id, failure] : launch_failures) {
    if (states.count(id)) continue;
    request.workloads.push_back(failure);
    states[id] = failure.state;
  }
  reported = std::move(states);
  request.known_version = known_version;
  request.wait_ms = wait_ms;
  return request;
}

std::shared_ptr<PendingCall> ControlLoop::State::Send(const api::SyncRequest& request,
                                                      TimeMs timeout_ms) {
  auto call = std::make_shared<PendingCall>();
  net::HttpCallOptions http;
  http.body = nlohmann::json(request).dump();
  http.timeout = milliseconds(timeout_ms);
  http.headers.emplace_back("Authorization", "Bearer " + options.token);
  http.ca_file = options.ca_file;
  try {
    // Detached so that Stop() returns at once even while the server holds the call; the thread
    // touches only its own copies, `call` and `wakeup`, and ends within the timeout.
    std::thread([wake = wakeup, call, servers = *servers, http = std::move(http)] {
      net::HttpResult result = servers.Call("POST", kSyncPath, http);
      std::lock_guard lock(wake->mutex);
      call->result = std::move(result);
      call->done = true;
      wake->changed.notify_all();
    }).detach();
  } catch (const std::system_error& error) {
    std::lock_guard lock(wakeup->mutex);
    call->result.error = fmt::format("start a thread for the sync: {}", error.what());
    call->done = true;
  }
  return call;
}

// Waits for `call`, running `tick` every watch interval meanwhile. False when stopping.
template <typename Tick>
bool ControlLoop::State::Await(const std::shared_ptr<PendingCall>& call, Tick tick) {
  const milliseconds interval(std::max<TimeMs>(options.watch_interval_ms, 1));
  for (;;) {
    {
      std::unique_lock lock(wakeup->mutex);
      wakeup->changed.wait_for(lock, interval, [&] { return wakeup->stopping || call->done; });
      if (wakeup->stopping) return false;
      if (call->done) return true;
    }
    tick();
  }
}

std::optional<api::SyncResponse> ControlLoop::State::Answer(const PendingCall& call,
                                                            std::string& error) const {
  if (!call.result.ok()) {
    error = call.result.error;
    return std::nullopt;
  }
  const net::HttpClientResponse& response = *call.result.response;
  if (response.status != 200) {
    std::string message = response.body;
    auto body = nlohmann::json::parse(response.body, nullptr, false);
    if (body.is_object() && body.contains("error") && body["error"].is_string())
      message = body["error"].get<std::string>();
    error = fmt::format("{} answered HTTP {}: {}{}", SyncUrl(), response.status, message,
                        response.status == 401 ? " (check the agent's token)" : "");
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(response.body).get<api::SyncResponse>();
  } catch (const nlohmann::json::exception& parse_error) {
    error = fmt::format("{} answered a sync that is not one: {}", SyncUrl(), parse_error.what());
    return std::nullopt;
  }
}

void ControlLoop::State::NoteError(const std::string& error) {
  // Once per distinct error: a server down for an hour is one line, not thousands.
  if (error != logged_error) Log(fmt::format("sync with the server failed: {}", error));
  logged_error = error;
  std::lock_guard lock(status_mutex);
  status.connected = false;
  status.last_error = error;
}

void ControlLoop::State::NoteSuccess() {
  if (!logged_error.empty()) Log(fmt::format("syncing with {} again", servers->current()));
  logged_error.clear();
  std::lock_guard lock(status_mutex);
  status.connected = true;
  status.last_error.clear();
  status.last_sync_ms = WallClockMs();
  status.known_version = known_version;
  ++status.syncs;
}

bool ControlLoop::State::LaunchTask(const api::TaskLaunch& task,
                                    const std::vector<WorkloadView>& views) {
  auto fail = [&](const std::string& error) {
    api::WorkloadReport report;
    report.workload_id = task.workload_id;
    report.job_id = task.job_id;
    report.rank = task.rank;
    report.attempt = task.attempt;
    report.state = std::string(WorkloadStateName(WorkloadState::kFailedToStart));
    report.error = error;
    report.finished_ms = WallClockMs();
    launch_failures[task.workload_id] = report;
    Log(fmt::format("task {} of job {} failed to start: {}", task.workload_id, task.job_id, error));
    std::lock_guard lock(status_mutex);
    ++status.launch_failures;
    return true;
  };
  if (task.job_id == 0) return fail("the server sent a task without a job id");
  // GPUs still held by a workload being cancelled are free once it ends (within its grace
  // period): wait for that rather than fail the task.
  for (const WorkloadView& view : views) {
    if (!Active(view.status.state) || !cancel_sent.count(view.status.id)) continue;
    for (int32_t index : task.gpu_indices) {
      if (std::find(view.spec.gpu_indices.begin(), view.spec.gpu_indices.end(), index) ==
          view.spec.gpu_indices.end())
        continue;
      if (deferred.insert(task.workload_id).second)
        Log(fmt::format("task {} waits for GPU {}, still held by the cancelled workload {}",
                        task.workload_id, index, view.status.id));
      return false;
    }
  }
  deferred.erase(task.workload_id);

  // A replica's port held by another program would make it fail to listen, or worse, have the
  // other program answer its readiness probe and its requests: refused before it starts.
  if (task.port > 0) {
    if (auto busy = PortInUse(options.address, task.port))
      return fail(fmt::format("port {} on {} is in use by another program: {}", task.port,
                              options.address, *busy));
  }
  LaunchRequest request;
  request.id = task.workload_id;
  request.job_id = task.job_id;
  request.task_index = task.rank;
  request.platform_user = task.user;
  request.argv = task.argv;
  request.env = task.env;
  request.workdir = task.workdir;
  request.container = task.container;
  request.gpu_indices = task.gpu_indices;  // exactly these, even none
  request.gpu_milli = task.gpu_milli;
  request.cpu_milli = task.cpu_milli;
  request.memory_mib = task.memory_mib;
  request.max_runtime_ms = task.max_runtime_ms;
  if (task.grace_period_ms > 0) request.grace_period_ms = task.grace_period_ms;
  // One checkpoint directory per job, the same for every attempt, made before the task starts.
  const std::string checkpoint_dir =
      !task.checkpoint_dir.empty()
          ? task.checkpoint_dir
          : fmt::format("{}/checkpoints/job-{}", core.data_dir(), task.job_id);
  std::error_code dir_error;
  std::filesystem::create_directories(checkpoint_dir, dir_error);
  if (dir_error)
    return fail(fmt::format("cannot create the checkpoint directory {}: {}", checkpoint_dir,
                            dir_error.message()));
  request.env["GPUFLEET_CHECKPOINT_DIR"] = checkpoint_dir;
  auto launched = core.Launch(request);
  if (!launched.ok()) return fail(launched.error().message);
  // A command that cannot be executed is on disk as failed_to_start: reported from there.
  std::lock_guard lock(status_mutex);
  ++status.launches;
  return true;
}

// Launches what is desired and missing, cancels job workloads not desired, forgets old ones.
// Returns whether anything changed (worth reporting at once).
bool ControlLoop::State::Apply() {
  std::map<std::string, const api::TaskLaunch*> wanted;
  for (const api::TaskLaunch& task : desired)
    wanted[task.workload_id] = &task;
  std::vector<WorkloadView> views = core.List();
  std::set<std::string> existing;
  for (const WorkloadView& view : views)
    existing.insert(view.status.id);
  bool changed = false;

  // Cancel first, so that GPUs a new task needs start to come free.
  for (const WorkloadView& view : views) {
    const std::string& id = view.status.id;
    if (view.spec.job_id == 0 || wanted.count(id) || cancel_sent.count(id)) continue;
    if (!Active(view.status.state) && view.status.state != WorkloadState::kLost) continue;
    auto cancelled = core.Cancel(id, std::nullopt);
    cancel_sent.insert(id);  // once: a second cancel changes nothing
    if (!cancelled.ok()) {
      Log(fmt::format("cancel workload {}: {}", id, cancelled.error().message));
      continue;
    }
    Log(fmt::format("workload {} (job {}) is no longer wanted by the server: cancelled", id,
                    view.spec.job_id));
    changed = true;
    std::lock_guard lock(status_mutex);
    ++status.cancels;
  }

  for (const api::TaskLaunch& task : desired) {
    attempts[task.workload_id] = task.attempt;
    if (existing.count(task.workload_id) || launch_failures.count(task.workload_id)) continue;
    changed = LaunchTask(task, views) || changed;
  }

  // What the server no longer wants needs no bookkeeping.
  std::erase_if(launch_failures, [&](const auto& entry) { return !wanted.count(entry.first); });
  std::erase_if(deferred, [&](const std::string& id) { return !wanted.count(id); });
  std::erase_if(attempts, [&](const auto& entry) {
    return !wanted.count(entry.first) && !existing.count(entry.first);
  });
  std::erase_if(cancel_sent, [&](const std::string& id) { return !existing.count(id); });

  std::set<std::string> wanted_ids;
  for (const auto& [id, task] : wanted)
    wanted_ids.insert(id);
  CollectGarbage(views, wanted_ids);
  std::map<std::string, ReadinessTarget> probes;
  for (const api::TaskLaunch& task : desired)
    if (task.port > 0 && !task.readiness_path.empty())
      probes[task.workload_id] = ReadinessTarget{options.address, task.port, task.readiness_path};
  readiness.SetTargets(probes);
  return changed;
}

void ControlLoop::State::CollectGarbage(const std::vector<WorkloadView>& views,
                                        const std::set<std::string>& wanted) {
  const auto now = Clock::now();
  if (options.gc_interval_ms > 0 && last_gc != Clock::time_point{} &&
      now - last_gc < milliseconds(options.gc_interval_ms))
    return;
  last_gc = now;
  // Finished job workloads the server is done with, oldest end first.
  std::vector<std::pair<TimeMs, std::string>> finished;
  for (const WorkloadView& view : views) {
    if (view.spec.job_id == 0 || wanted.count(view.status.id) || !Ended(view.status)) continue;
    const TimeMs ended =
        view.status.finished_at_ms > 0 ? view.status.finished_at_ms : view.status.started_at_ms;
    finished.emplace_back(ended, view.status.id);
  }
  std::sort(finished.begin(), finished.end());
  const TimeMs wall = WallClockMs();
  size_t left = finished.size();
  for (const auto& [ended, id] : finished) {
    if (left <= options.max_finished && wall - ended < options.retention_ms) break;
    if (auto error = core.Forget(id)) {
      // A lost workload whose processes still run cannot be forgotten yet; tried again later.
      if (forget_failed.insert(id).second)
        Log(fmt::format("cannot remove finished workload {}: {}", id, error->message));
      continue;
    }
    forget_failed.erase(id);
    --left;
    attempts.erase(id);
    std::lock_guard lock(status_mutex);
    ++status.forgotten;
  }
}

// Whether a workload reported as starting or running has moved on since the latest sync.
bool ControlLoop::State::WorkloadsChanged() {
  for (const auto& [id, state] : reported) {
    if (state != WorkloadStateName(WorkloadState::kStarting) &&
        state != WorkloadStateName(WorkloadState::kRunning))
      continue;
    auto view = core.Get(id);
    if (!view.ok() || WorkloadStateName(view.value().status.state) != state) return true;
  }
  return false;
}

// Reports at once, while the long poll is outstanding. Its answer is not applied: a change of
// desired state answers the long poll too.
void ControlLoop::State::ShortSync() {
  auto call = Send(BuildRequest(0), kSyncCallMarginMs);
  if (!Await(call, [] {})) return;
  std::string error;
  if (!Answer(*call, error)) NoteError(error);
}

void ControlLoop::State::Run() {
  TimeMs backoff_ms = 0;
  while (!Stopping()) {
    TimeMs wait_ms = std::max<TimeMs>(options.wait_ms, 0);
    if (heartbeat_ms > 0) wait_ms = std::min(wait_ms, heartbeat_ms);
    const uint64_t version_before = known_version;
    auto call = Send(BuildRequest(static_cast<int32_t>(wait_ms)), wait_ms + kSyncCallMarginMs);
    const bool answered = Await(call, [&] {
      bool report = readiness.TakeChanged();
      report = WorkloadsChanged() || report;
      if (!deferred.empty()) report = Apply() || report;  // GPUs may have come free
      if (report) ShortSync();
    });
    if (!answered) return;

    std::string error;
    std::optional<api::SyncResponse> response = Answer(*call, error);
    if (!response) {
      NoteError(error);
      backoff_ms =
          backoff_ms == 0 ? kSyncFirstBackoffMs : std::min(backoff_ms * 2, kSyncMaxBackoffMs);
      if (!SleepFor(backoff_ms)) return;
      continue;
    }
    backoff_ms = 0;
    // Level-triggered: every answer is the whole truth, applied as it is, even with an older
    // version (a restarted server may count from the start again).
    known_version = response->version;
    desired = std::move(response->desired);
    heartbeat_ms = response->heartbeat_ms;
    NoteSuccess();
    const bool changed = Apply();
    // Loop at once: what was launched is reported as running by the next sync.
    const bool quick = Clock::now() - call->sent < milliseconds(kQuickAnswerMs);
    if (!changed && quick && wait_ms > 0 && known_version == version_before &&
        !SleepFor(kQuickAnswerPauseMs))
      return;
  }
}

ControlLoop::ControlLoop(AgentCore& core, ControlLoopOptions options)
    : state_(std::make_unique<State>(core, std::move(options))) {}

ControlLoop::~ControlLoop() {
  Stop();
}

std::optional<std::string> ControlLoop::Start() {
  State& state = *state_;
  if (state.thread.joinable()) return "the control loop already runs";
  std::string error;
  state.servers = net::ServerUrls::Parse(state.options.server_url, error);
  if (!state.servers) return fmt::format("--server: {}", error);
  {
    std::lock_guard lock(state.wakeup->mutex);
    state.wakeup->stopping = false;
  }
  try {
    state.thread = std::thread([&state] { state.Run(); });
  } catch (const std::system_error& thread_error) {
    return fmt::format("start the control loop: {}", thread_error.what());
  }
  std::lock_guard lock(state.status_mutex);
  state.status.running = true;
  return std::nullopt;
}

void ControlLoop::Stop() {
  State& state = *state_;
  {
    std::lock_guard lock(state.wakeup->mutex);
    state.wakeup->stopping = true;
  }
  state.wakeup->changed.notify_all();
  if (state.thread.joinable()) state.thread.join();
  std::lock_guard lock(state.status_mutex);
  state.status.running = false;
}

void ControlLoop::set_agent_url(std::string url) {
  state_->options.agent_url = std::move(url);
}

ControlLoopStatus ControlLoop::Status() const {
  std::lock_guard lock(state_->status_mutex);
  return state_->status;
}

const ControlLoopOptions& ControlLoop::options() const {
  return state_->options;
}

}  // namespace gpufleet::agent
