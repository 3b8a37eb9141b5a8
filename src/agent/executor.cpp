#include "agent/executor.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/executor_files.h"
#include "agent/executor_util.h"

extern char** environ;

namespace gpufleet::agent {

using executor_internal::CancelRequest;
using executor_internal::ErrnoText;
using executor_internal::FinalStatus;
using executor_internal::LoadStateFile;
using executor_internal::ProcessRecord;
using executor_internal::ShimSpec;
using executor_internal::WallClockMs;
using executor_internal::WorkloadPaths;
using executor_internal::WriteFileAtomically;

namespace {

// Workload ids are unique per agent, not per machine: two agents (tests, a dev cluster beside
// an agent) may both run "j1-r0-a0", and a shim empties and removes its cgroup when it ends. The
// data dir's hash in the name keeps each agent's cgroups its own. FNV-1a, so names are stable.
std::string CgroupLeafName(const std::string& workload_id, const std::string& data_dir) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : data_dir) {
    hash ^= c;
    hash *= 16777619u;
  }
  return fmt::format("{}-{:08x}", workload_id, hash);
}

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr int kShimReadyFd = 3;

std::string JoinInts(const std::vector<int32_t>& values) {
  return fmt::format("{}", fmt::join(values, ","));
}

std::vector<std::string> BuildEnvironment(const WorkloadSpec& spec, const std::string& tmp) {
  std::map<std::string, std::string> env = spec.env;
  env.try_emplace("PATH", kDefaultPath);
  const bool container = !spec.container.image.empty();
  // Its own temporary directory, which other workloads cannot read (tempfile, torch and most
  // tools honour these), rather than the node's shared /tmp. A container's /tmp is its own.
  for (const char* name : {"TMPDIR", "TMP", "TEMP"})
    env[name] = container ? std::string("/tmp") : tmp;
  // Ours win over the user's: they are what confines the workload to its GPUs.
  // A MIG instance has no CUDA index of its own: CUDA takes it by its "MIG-..." UUID only.
  const bool mig = std::any_of(spec.gpu_uuids.begin(), spec.gpu_uuids.end(),
                               [](const std::string& uuid) { return uuid.starts_with("MIG-"); });
  std::string visible =
      mig ? fmt::format("{}", fmt::join(spec.gpu_uuids, ",")) : JoinInts(spec.gpu_indices);
  if (container && !mig) {
    // A container holds only its GPUs' device nodes, and CUDA numbers those from 0.
    std::vector<int32_t> inside;
    for (size_t i = 0; i < spec.gpu_indices.size(); ++i)
      inside.push_back(static_cast<int32_t>(i));
    visible = JoinInts(inside);
    env["GPUFLEET_NODE_GPU_INDICES"] = JoinInts(spec.gpu_indices);
  }
  env["CUDA_VISIBLE_DEVICES"] = visible;  // "" = no GPU
  // CUDA's default order is fastest-first; PCI order matches NVML's indices.
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  env["NVIDIA_VISIBLE_DEVICES"] = spec.gpu_indices.empty() ? "none" : visible;
  env["GPUFLEET_GPU_UUIDS"] = fmt::format("{}", fmt::join(spec.gpu_uuids, ","));
  env["GPUFLEET_JOB_ID"] = std::to_string(spec.job_id);
  env["GPUFLEET_TASK_INDEX"] = std::to_string(spec.task_index);
  env["GPUFLEET_WORKLOAD_ID"] = spec.id;
  std::vector<std::string> entries;
  for (const auto& [key, value] : env)
    entries.push_back(key + "=" + value);
  return entries;
}

// Async-signal-safe report from the executor's forked children: "start-error <stage> <errno>\n".
void ReportStartError(int fd, char stage, int err) {
  char message[48] = "start-error ";
  size_t length = 12;
  message[length++] = stage;
  message[length++] = ' ';
  length +=
      executor_internal::FormatDecimal(err < 0 ? 0u : static_cast<unsigned>(err), message + length);
  message[length++] = '\n';
  [[maybe_unused]] ssize_t ignored = ::write(fd, message, length);
}

std::string StartStageName(char stage) {
  switch (stage) {
    case 's':
      return "setsid";
    case 'f':
      return "fork";
    case 'd':
      return "set up file descriptors";
    case 'e':
      return "exec";
    default:
      return "start";
  }
}

std::string LastLine(const std::string& path) {
  auto text = executor_internal::ReadFileToString(path);
  if (!text) return "";
  while (!text->empty() && text->back() == '\n')
    text->pop_back();
  size_t newline = text->rfind('\n');
  return newline == std::string::npos ? *text : text->substr(newline + 1);
}

bool IsRunningState(WorkloadState state) {
  return state == WorkloadState::kStarting || state == WorkloadState::kRunning;
}

// Everything known about one workload from its files.
struct Inspection {
  WorkloadStatus status;
  std::optional<ShimSpec> spec;
  std::optional<ProcessRecord> shim;
  std::optional<ProcessRecord> workload;
};

}  // namespace

struct Executor::State {
  ExecutorConfig config;
  std::string workloads_dir;
  std::string shim_path;  // resolved shim_command[0]
  CgroupManager cgroups;
  int lock_fd = -1;
  std::vector<WorkloadStatus> adopted;

  mutable std::mutex mutex;
  std::set<std::string> launching;
  mutable std::map<std::string, ShimSpec> spec_cache;  // spec.json never changes once written

  // SIGKILL deadlines (wall clock) of cancelled lost workloads: no shim enforces them.
  std::mutex kill_mutex;
  std::condition_variable kill_wakeup;
  std::map<std::string, TimeMs> kill_deadlines;
  bool stopping = false;
  std::thread killer;

  WorkloadPaths PathsOf(const std::string& id) const {
    return WorkloadPaths::For(workloads_dir + "/" + id);
  }
  std::optional<ShimSpec> LoadSpec(const std::string& id, std::string& error) const;
  ExecutorResult<Inspection> Inspect(const std::string& id) const;
  std::optional<std::string> StartShim(const WorkloadPaths& paths, std::string& message,
                                       bool& shim_gone);
  void RecordStartFailure(const WorkloadPaths& paths, const ShimSpec& spec, const std::string& why);
  void ArmKill(const std::string& id, TimeMs deadline_ms);
  void KillerLoop();
  void KillLostWorkload(const std::string& id, int signal_number) const;
};

std::optional<ShimSpec> Executor::State::LoadSpec(const std::string& id, std::string& error) const {
  {
    std::lock_guard lock(mutex);
    if (auto cached = spec_cache.find(id); cached != spec_cache.end()) return cached->second;
  }
  ShimSpec spec;
  bool exists = false;
  auto load_error = LoadStateFile(PathsOf(id).spec, spec, exists);
  if (load_error || !exists) {
    error = load_error ? *load_error : "no spec.json (the launch was interrupted)";
    return std::nullopt;
  }
  std::lock_guard lock(mutex);
  spec_cache.emplace(id, spec);
  return spec;
}

ExecutorResult<Inspection> Executor::State::Inspect(const std::string& id) const {
  if (id.empty() || id[0] == '.' || id.find('/') != std::string::npos)
    return ExecutorError{fmt::format("no workload '{}'", id)};
  const WorkloadPaths paths = PathsOf(id);
  struct stat info {};
  if (::stat(paths.dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    return ExecutorError{fmt::format("no workload '{}'", id)};

  Inspection inspection;
  WorkloadStatus& status = inspection.status;
  status.id = id;
  bool is_launching;
  {
    std::lock_guard lock(mutex);
    is_launching = launching.count(id) > 0;
  }
  std::string spec_error;
  inspection.spec = LoadSpec(id, spec_error);
  if (!inspection.spec) {
    status.state = is_launching ? WorkloadState::kStarting : WorkloadState::kFailedToStart;
    if (!is_launching) status.error = "incomplete workload directory: " + spec_error;
    return inspection;
  }
  const ShimSpec& spec = *inspection.spec;
  status.cgroup_version = spec.cgroup.version;
  status.cgroup_paths = spec.cgroup.dirs;
  status.limits_applied = spec.limits_applied;
  status.limits_warning = spec.limits_warning;
  status.stdout_log = paths.stdout_log;
  status.stderr_log = paths.stderr_log;

  auto apply_final = [&](const FinalStatus& final) {
    status.state = final.state;
    status.pid = status.pgid = final.pid;
    status.exit_code = final.exit_code;
    status.signal = final.signal;
    status.core_dumped = final.core_dumped;
    status.cancelled = final.cancelled;
    status.timed_out = final.timed_out;
    status.killed_after_grace = final.killed_after_grace;
    status.oom_killed = final.oom_killed;
    status.started_at_ms = final.started_at_ms;
    status.finished_at_ms = final.finished_at_ms;
    status.error = final.error;
    status.user_cpu_ms = final.user_cpu_ms;
    status.system_cpu_ms = final.system_cpu_ms;
    status.max_rss_kib = final.max_rss_kib;
    status.log_bytes_dropped = final.log_bytes_dropped;
    if (!final.cleanup_warning.empty())
      status.error = status.error.empty() ? final.cleanup_warning
                                          : status.error + "; " + final.cleanup_warning;
  };
  // Returns whether status.json settled the state.
  auto read_final = [&]() {
    FinalStatus final;
    bool exists = false;
    auto error = LoadStateFile(paths.status, final, exists);
    if (!exists) return false;
    if (error) {
      status.state = WorkloadState::kLost;
      status.error = "unreadable final status: " + *error;
    } else {
      apply_final(final);
    }
    return true;
  };
  if (read_final()) return inspection;

  bool exists = false;
  ProcessRecord shim;
  if (!LoadStateFile(paths.shim_pid, shim, exists) && exists) {
    inspection.shim = shim;
    status.shim_pid = shim.pid;
  }
  ProcessRecord workload;
  if (!LoadStateFile(paths.workload_pgid, workload, exists) && exists) {
    inspection.workload = workload;
    status.pid = status.pgid = workload.pid;
    status.started_at_ms = workload.started_at_ms;
  }
  status.cancelled = ::access(paths.cancel.c_str(), F_OK) == 0;

  if (inspection.shim && executor_internal::IsLiveProcess(shim.pid, shim.start_ticks)) {
    status.state = inspection.workload ? WorkloadState::kRunning : WorkloadState::kStarting;
    // What a starting workload waits for: its image, mostly.
    if (!inspection.workload)
      if (auto phase = executor_internal::ReadFileToString(paths.phase)) status.error = *phase;
    return inspection;
  }
  // The shim writes status.json just before it exits: look again now that it is gone.
  if (read_final()) return inspection;
  if (!inspection.shim) {
    if (is_launching || WallClockMs() - spec.created_at_ms < config.launch_timeout) {
      status.state = WorkloadState::kStarting;
      return inspection;
    }
    status.state = WorkloadState::kLost;
    status.error = fmt::format("the shim never started (no shim.pid; see {})", paths.shim_log);
    return inspection;
  }
  status.state = WorkloadState::kLost;
  std::string fate;
  if (!inspection.workload) {
    fate = "before the workload started";
  } else {
    auto members = executor_internal::LiveGroupMembers(workload.pid, workload.start_ticks);
    auto in_cgroup = CgroupMembers(spec.cgroup);
    if (!members.empty() || !in_cgroup.empty())
      fate = fmt::format(
          "while the workload ran; {} of its processes still run (Cancel kills "
          "them) but their exit status will not be known",
          std::max(members.size(), in_cgroup.size()));
    else
      fate = "while the workload ran; its processes are gone and their exit status is unknown";
  }
  status.error = fmt::format(
      "the shim (pid {}) died without recording how the workload ended, "
      "{} (see {})",
      shim.pid, fate, paths.shim_log);
  return inspection;
}

void Executor::State::RecordStartFailure(const WorkloadPaths& paths, const ShimSpec& spec,
                                         const std::string& why) {
  FinalStatus final;
  final.state = WorkloadState::kFailedToStart;
  final.error = why;
  final.finished_at_ms = WallClockMs();
  if (!spec.cgroup.dirs.empty())
    if (auto error = RemoveCgroup(spec.cgroup)) final.cleanup_warning = *error;
  // Without it the workload would read as lost; nothing better to do if this fails too.
  [[maybe_unused]] auto ignored =
      WriteFileAtomically(paths.status, executor_internal::ToJson(final));
}

// Starts the shim detached: setsid, then a second fork whose child execs the shim, so the shim is
// in its own session and not our child (it is re-parented to init and outlives us). Waits for the
// shim's one-line report ("running", "failed") or our children's "start-error ...".
std::optional<std::string> Executor::State::StartShim(const WorkloadPaths& paths,
                                                      std::string& message, bool& shim_gone) {
  shim_gone = false;
  std::vector<std::string> args = config.shim_command;
  args.insert(args.end(), {"--spec", paths.spec, "--ready-fd", std::to_string(kShimReadyFd)});
  std::vector<char*> argv;
  for (std::string& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  const char* shim = shim_path.c_str();
  rlimit files{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 65536
                         ? static_cast<int>(files.rlim_cur)
                         : 65536;

  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  int log_fd = ::open(paths.shim_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int ready[2] = {-1, -1};
  if (null_fd < 0 || log_fd < 0 || ::pipe2(ready, O_CLOEXEC) != 0) {
    std::string error = fmt::format("prepare the shim's files: {}", ErrnoText(errno));
    for (int fd : {null_fd, log_fd, ready[0], ready[1]})
      if (fd >= 0) ::close(fd);
    return error;
  }

  pid_t child = ::fork();
  if (child == 0) {
    // Async-signal-safe calls only: the agent has other threads.
    if (::setsid() < 0) {
      ReportStartError(ready[1], 's', errno);
      ::_exit(1);
    }
    // _Fork: fork() may run other libraries' atfork handlers, which are not async-signal-safe.
    pid_t grandchild = ::_Fork();
    if (grandchild < 0) {
      ReportStartError(ready[1], 'f', errno);
      ::_exit(1);
    }
    if (grandchild > 0) ::_exit(0);
    // Move our fds above 2 and 3 first, so the dup2 calls below cannot clobber each other.
    int high_null = ::fcntl(null_fd, F_DUPFD_CLOEXEC, 10);
    int high_log = ::fcntl(log_fd, F_DUPFD_CLOEXEC, 10);
    int high_ready = ::fcntl(ready[1], F_DUPFD_CLOEXEC, 10);
    if (high_null < 0 || high_log < 0 || high_ready < 0 || ::dup2(high_null, 0) < 0 ||
        ::dup2(high_null, 1) < 0 || ::dup2(high_log, 2) < 0 ||
        ::dup2(high_ready, kShimReadyFd) < 0) {
      ReportStartError(ready[1], 'd', errno);
      ::_exit(1);
    }
    // Nothing else of the agent's leaks into the shim (and so into workloads).
    if (::close_range(kShimReadyFd + 1, ~0U, 0) != 0)
      for (int fd = kShimReadyFd + 1; fd < max_fd; ++fd)
        ::close(fd);
    ::execve(shim, argv.data(), environ);
    ReportStartError(kShimReadyFd, 'e', errno);
    ::_exit(127);
  }
  int fork_error = errno;
  ::close(ready[1]);
  ::close(null_fd);
  ::close(log_fd);
  if (child < 0) {
    ::close(ready[0]);
    return fmt::format("fork: {}", ErrnoText(fork_error));
  }
  // The intermediate child exits at once; ECHILD if the agent ignores SIGCHLD.
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }

  const TimeMs deadline = executor_internal::MonotonicMs() + config.launch_timeout;
  message.clear();
  while (message.find('\n') == std::string::npos) {
    TimeMs left = deadline - executor_internal::MonotonicMs();
    if (left <= 0) break;
    pollfd poll_fd{ready[0], POLLIN, 0};
    int ready_count = ::poll(&poll_fd, 1, static_cast<int>(left));
    if (ready_count < 0 && errno == EINTR) continue;
    if (ready_count <= 0) break;
    char buffer[128];
    ssize_t got = ::read(ready[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      shim_gone = true;  // EOF: every copy of the pipe closed, the shim included
      break;
    }
    message.append(buffer, static_cast<size_t>(got));
  }
  ::close(ready[0]);
  return std::nullopt;
}

void Executor::State::ArmKill(const std::string& id, TimeMs deadline_ms) {
  std::lock_guard lock(kill_mutex);
  auto [entry, inserted] = kill_deadlines.emplace(id, deadline_ms);
  if (!inserted) entry->second = std::min(entry->second, deadline_ms);
  kill_wakeup.notify_all();
}

void Executor::State::KillLostWorkload(const std::string& id, int signal_number) const {
  auto inspection = Inspect(id);
  if (!inspection.ok() || inspection.value().status.state != WorkloadState::kLost) return;
  const Inspection& found = inspection.value();
  if (found.workload &&
      !executor_internal::LiveGroupMembers(found.workload->pid, found.workload->start_ticks)
           .empty())
    ::kill(-found.workload->pid, signal_number);
  if (found.spec)
    for (int32_t pid : CgroupMembers(found.spec->cgroup))
      ::kill(pid, signal_number);
}

void Executor::State::KillerLoop() {
  std::unique_lock lock(kill_mutex);
  while (!stopping) {
    if (kill_deadlines.empty()) {
      kill_wakeup.wait(lock);
      continue;
    }
    auto next = std::min_element(kill_deadlines.begin(), kill_deadlines.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    TimeMs wait_ms = next->second - WallClockMs();
    if (wait_ms > 0) {
      kill_wakeup.wait_for(lock, std::chrono::milliseconds(wait_ms));
      continue;
    }
    std::string id = next->first;
    kill_deadlines.erase(next);
    lock.unlock();
    KillLostWorkload(id, SIGKILL);
    lock.lock();
  }
}

ExecutorResult<std::unique_ptr<Executor>> Executor::Open(ExecutorConfig config) {
  namespace fs = std::filesystem;
  if (config.data_dir.empty()) return ExecutorError{"executor: data_dir is empty"};
  if (config.shim_command.empty() || config.shim_command[0].empty())
    return ExecutorError{"executor: shim_command is empty"};
  if (config.launch_timeout <= 0) return ExecutorError{"executor: launch_timeout must be positive"};

  auto state = std::make_unique<State>();
  std::error_code error;
  fs::path data_dir = fs::absolute(config.data_dir, error);
  if (error)
    return ExecutorError{fmt::format("data dir '{}': {}", config.data_dir, error.message())};
  config.data_dir = data_dir.lexically_normal().string();
  state->workloads_dir = (data_dir / "workloads").lexically_normal().string();
  fs::create_directories(state->workloads_dir, error);
  // Passable, not listable: a workload running as another user reaches its own directory only.
  if (!error) ::chmod(state->workloads_dir.c_str(), 0711);
  if (error)
    return ExecutorError{fmt::format("create '{}': {}", state->workloads_dir, error.message())};

  // Two executors over one data dir would both adopt, signal and forget the same workloads.
  std::string lock_path = config.data_dir + "/executor.lock";
  state->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (state->lock_fd < 0)
    return ExecutorError{fmt::format("open '{}': {}", lock_path, ErrnoText(errno))};
  if (::flock(state->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(state->lock_fd);
    return ExecutorError{
        err == EWOULDBLOCK
            ? fmt::format("data dir '{}' is in use by another executor", config.data_dir)
            : fmt::format("lock '{}': {}", lock_path, ErrnoText(err))};
  }

  const char* path_env = std::getenv("PATH");
  int resolve_error = 0;
  auto shim_path = executor_internal::ResolveCommand(
      config.shim_command[0], path_env ? path_env : kDefaultPath, "", resolve_error);
  if (!shim_path || ::access(shim_path->c_str(), X_OK) != 0) {
    int err = shim_path ? errno : resolve_error;
    ::close(state->lock_fd);
    return ExecutorError{
        fmt::format("shim command '{}': {}", config.shim_command[0], ErrnoText(err))};
  }
  state->shim_path = *shim_path;
  state->cgroups = CgroupManager::Detect(
      {config.cgroup_mode, config.cgroup_parent, config.cgroup_mountinfo_path});
  state->config = std::move(config);

  try {
    state->killer = std::thread([raw = state.get()] { raw->KillerLoop(); });
  } catch (const std::system_error& thread_error) {
    ::close(state->lock_fd);
    return ExecutorError{fmt::format("start the executor's timer thread: {}", thread_error.what())};
  }
  std::unique_ptr<Executor> executor(new Executor(std::move(state)));
  State& opened = *executor->state_;
  opened.adopted = executor->List();
  // Cancelled lost workloads still owe a SIGKILL at the end of their grace period.
  for (const WorkloadStatus& status : opened.adopted) {
    if (status.state != WorkloadState::kLost || !status.cancelled) continue;
    CancelRequest request;
    bool exists = false;
    if (!LoadStateFile(opened.PathsOf(status.id).cancel, request, exists) && exists)
      opened.ArmKill(status.id, request.requested_at_ms + request.grace_ms);
  }
  return executor;
}

Executor::Executor(std::unique_ptr<State> state) : state_(std::move(state)) {}

Executor::~Executor() {
  {
    std::lock_guard lock(state_->kill_mutex);
    state_->stopping = true;
  }
  state_->kill_wakeup.notify_all();
  if (state_->killer.joinable()) state_->killer.join();
  if (state_->lock_fd >= 0) ::close(state_->lock_fd);
}

CgroupVersion Executor::cgroup_version() const {
  return state_->cgroups.version();
}
const std::string& Executor::cgroup_warning() const {
  return state_->cgroups.warning();
}
const std::vector<WorkloadStatus>& Executor::adopted() const {
  return state_->adopted;
}

ExecutorResult<WorkloadStatus> Executor::Launch(const WorkloadSpec& spec) {
  State& state = *state_;
  if (auto error = ValidateWorkloadSpec(spec))
    return ExecutorError{fmt::format("invalid workload spec: {}", *error)};
  const WorkloadPaths paths = state.PathsOf(spec.id);
  // mkdir is the duplicate check: atomic, and it also sees workloads of earlier executors.
  if (::mkdir(paths.dir.c_str(), 0755) != 0) {
    int err = errno;
    if (err == EEXIST) {
      auto existing = Get(spec.id);
      return ExecutorError{
          fmt::format("a workload with id '{}' already exists ({}); Forget it first", spec.id,
                      existing.ok() ? WorkloadStateName(existing.value().state) : "unreadable")};
    }
    return ExecutorError{fmt::format("create '{}': {}", paths.dir, ErrnoText(err))};
  }
  {
    std::lock_guard lock(state.mutex);
    state.launching.insert(spec.id);
  }
  struct LaunchingGuard {
    State& state;
    std::string id;
    ~LaunchingGuard() {
      std::lock_guard lock(state.mutex);
      state.launching.erase(id);
    }
  } guard{state, spec.id};
  auto abandon = [&](const std::string& why) -> ExecutorResult<WorkloadStatus> {
    std::error_code ignored;
    std::filesystem::remove_all(paths.dir, ignored);
    return ExecutorError{why};
  };

  ShimSpec shim_spec;
  shim_spec.workload = spec;
  shim_spec.workload_dir = paths.dir;
  shim_spec.workdir = spec.workdir.empty() ? paths.default_workdir : spec.workdir;
  if (spec.workdir.empty() && ::mkdir(paths.default_workdir.c_str(), 0755) != 0)
    return abandon(fmt::format("create '{}': {}", paths.default_workdir, ErrnoText(errno)));
  if (::mkdir(paths.tmp.c_str(), 0700) != 0)
    return abandon(fmt::format("create '{}': {}", paths.tmp, ErrnoText(errno)));
  if (spec.run_as) {
    // Another user may pass through the workload's directory to what is its own (its workdir
    // and TMPDIR), but not list it or read the logs and state the shim writes there.
    if (::chmod(paths.dir.c_str(), 0711) != 0)
      return abandon(fmt::format("chmod '{}': {}", paths.dir, ErrnoText(errno)));
    std::vector<std::string> owned = {paths.tmp};
    if (spec.workdir.empty()) owned.push_back(paths.default_workdir);
    for (const std::string& dir : owned)
      if (::chown(dir.c_str(), spec.run_as->uid, spec.run_as->gid) != 0 ||
          ::chmod(dir.c_str(), 0700) != 0)
        return abandon(
            fmt::format("give '{}' to {}: {}", dir, spec.run_as->name, ErrnoText(errno)));
  }
  shim_spec.env = BuildEnvironment(spec, paths.tmp);
  const bool cannot_contain = !spec.container.image.empty() && !state.config.containers.available();
  if (!spec.container.image.empty()) {
    shim_spec.containers = state.config.containers;
    shim_spec.container_id = "gpufleet-" + CgroupLeafName(spec.id, state.config.data_dir);
  }
  const bool wants_limits = spec.cpu_milli > 0 || spec.memory_mib > 0;
  if (state.cgroups.version() != CgroupVersion::kNone) {
    WorkloadCgroup cgroup;
    if (auto error = state.cgroups.Create(CgroupLeafName(spec.id, state.config.data_dir),
                                          {spec.cpu_milli, spec.memory_mib}, cgroup)) {
      shim_spec.limits_warning =
          fmt::format("no cgroup ({}); running without cpu/memory limits", *error);
    } else {
      shim_spec.cgroup = std::move(cgroup);
      shim_spec.limits_applied = true;
    }
  } else if (wants_limits) {
    shim_spec.limits_warning =
        state.cgroups.warning().empty()
            ? "cgroups are disabled (cgroup mode none); running without cpu/memory limits"
            : state.cgroups.warning();
  }
  shim_spec.created_at_ms = WallClockMs();
  if (auto error = WriteFileAtomically(paths.spec, executor_internal::ToJson(shim_spec))) {
    if (!shim_spec.cgroup.dirs.empty()) RemoveCgroup(shim_spec.cgroup);
    return abandon("write the workload spec: " + *error);
  }
  {
    std::lock_guard lock(state.mutex);
    state.spec_cache[spec.id] = shim_spec;
  }

  if (cannot_contain) {
    state.RecordStartFailure(
        paths, shim_spec,
        fmt::format("the job names image '{}', but containers cannot run on this node: {}",
                    spec.container.image, state.config.containers.runtime_description));
    return Get(spec.id);
  }
  std::string message;
  bool shim_gone = false;
  if (auto error = state.StartShim(paths, message, shim_gone)) {
    state.RecordStartFailure(paths, shim_spec, "could not start the shim: " + *error);
  } else if (message.rfind("start-error ", 0) == 0) {
    // "start-error <stage> <errno>" from our forked children: the shim never ran.
    char stage = message.size() > 12 ? message[12] : '?';
    int err = std::atoi(message.c_str() + std::min<size_t>(14, message.size()));
    state.RecordStartFailure(paths, shim_spec,
                             fmt::format("could not start the shim '{}': {}: {}", state.shim_path,
                                         StartStageName(stage), ErrnoText(err)));
  } else if (message.empty() && shim_gone && ::access(paths.status.c_str(), F_OK) != 0 &&
             ::access(paths.workload_pgid.c_str(), F_OK) != 0) {
    state.RecordStartFailure(
        paths, shim_spec,
        fmt::format("the shim exited before starting the workload; last line of {}: '{}'",
                    paths.shim_log, LastLine(paths.shim_log)));
  }
  return Get(spec.id);
}

ExecutorResult<WorkloadStatus> Executor::Cancel(const std::string& id,
                                                std::optional<TimeMs> grace_period) {
  State& state = *state_;
  auto inspection = state.Inspect(id);
  if (!inspection.ok()) return ExecutorError{inspection.error()};
  const Inspection& found = inspection.value();
  if (found.status.Finished() || !found.spec) return found.status;
  if (grace_period && *grace_period < 0)
    return ExecutorError{fmt::format("grace period {} ms is negative", *grace_period)};

  const TimeMs grace = grace_period.value_or(found.spec->workload.grace_period);
  const WorkloadPaths paths = state.PathsOf(id);
  CancelRequest request{WallClockMs(), grace};
  // A second cancel keeps the earlier deadline when that is sooner (the shim takes the minimum).
  CancelRequest earlier;
  bool exists = false;
  if (!LoadStateFile(paths.cancel, earlier, exists) && exists &&
      earlier.requested_at_ms + earlier.grace_ms < request.requested_at_ms + request.grace_ms)
    request = earlier;
  // Written before signalling: a shim that has not yet recorded its pid reads it once it has.
  if (auto error = WriteFileAtomically(paths.cancel, executor_internal::ToJson(request)))
    return ExecutorError{"record the cancel request: " + *error};

  if (found.status.state == WorkloadState::kLost) {
    // No shim enforces the grace period: we do.
    state.KillLostWorkload(id, SIGTERM);
    state.ArmKill(id, request.requested_at_ms + request.grace_ms);
  } else if (found.shim &&
             executor_internal::IsLiveProcess(found.shim->pid, found.shim->start_ticks)) {
    // The shim signals the group, times the grace period and records the outcome.
    ::kill(found.shim->pid, SIGUSR1);
  }
  return Get(id);
}

ExecutorResult<WorkloadStatus> Executor::Get(const std::string& id) const {
  auto inspection = state_->Inspect(id);
  if (!inspection.ok()) return ExecutorError{inspection.error()};
  return std::move(inspection.value().status);
}

ExecutorResult<WorkloadSpec> Executor::Spec(const std::string& id) const {
  auto inspection = state_->Inspect(id);
  if (!inspection.ok()) return ExecutorError{inspection.error()};
  if (!inspection.value().spec)
    return ExecutorError{fmt::format("workload '{}' has no readable spec.json", id)};
  return std::move(inspection.value().spec->workload);
}

std::vector<WorkloadStatus> Executor::List() const {
  std::vector<std::string> ids;
  if (DIR* dir = ::opendir(state_->workloads_dir.c_str())) {
    while (dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.') ids.emplace_back(entry->d_name);
    ::closedir(dir);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<WorkloadStatus> statuses;
  for (const std::string& id : ids) {
    auto status = Get(id);
    if (status.ok()) statuses.push_back(std::move(status.value()));
  }
  return statuses;
}

std::optional<std::string> Executor::Forget(const std::string& id) {
  State& state = *state_;
  auto inspection = state.Inspect(id);
  if (!inspection.ok()) return inspection.error();
  const Inspection& found = inspection.value();
  const WorkloadStatus& status = found.status;
  if (IsRunningState(status.state))
    return fmt::format("workload '{}' is {}; cancel it and wait for it to end first", id,
                       WorkloadStateName(status.state));
  if (status.state == WorkloadState::kLost) {
    size_t alive = 0;
    if (found.workload)
      alive += executor_internal::LiveGroupMembers(found.workload->pid, found.workload->start_ticks)
                   .size();
    if (found.spec) alive += CgroupMembers(found.spec->cgroup).size();
    if (alive > 0)
      return fmt::format("lost workload '{}' still has running processes; cancel it first", id);
  }
  if (found.spec && CgroupExists(found.spec->cgroup))
    if (auto error = RemoveCgroup(found.spec->cgroup))
      return fmt::format("workload '{}': {}", id, *error);
  std::error_code error;
  std::filesystem::remove_all(state.PathsOf(id).dir, error);
  {
    std::lock_guard lock(state.mutex);
    state.spec_cache.erase(id);
  }
  {
    std::lock_guard lock(state.kill_mutex);
    state.kill_deadlines.erase(id);
  }
  if (error) return fmt::format("remove '{}': {}", state.PathsOf(id).dir, error.message());
  return std::nullopt;
}

}  // namespace gpufleet::agent
