// The agent-shim process: see shim.h.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/container_runtime.h"
#include "agent/executor_files.h"
#include "agent/executor_util.h"
#include "agent/log_rotation.h"
#include "agent/shim.h"

namespace gpufleet::agent {
namespace {

using executor_internal::ErrnoText;
using executor_internal::FinalStatus;
using executor_internal::MonotonicMs;
using executor_internal::ProcessRecord;
using executor_internal::ShimSpec;
using executor_internal::WallClockMs;
using executor_internal::WorkloadPaths;
using executor_internal::WriteFileAtomically;

constexpr size_t kPipeReadBytes = 64 * 1024;
// After the workload's main process ends, how long to wait for its output pipes to close.
constexpr TimeMs kDrainTimeoutMs = 2000;
constexpr TimeMs kDrainPollMs = 100;
// The OCI runtime's PATH (for its hooks): nothing of the workload's.
constexpr const char* kShimPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// What the forked child reports through the CLOEXEC pipe when it fails before or at exec.
enum ChildStage : int32_t {
  kStageJoinCgroup = 1,
  kStageStdio = 2,
  kStageChdir = 3,
  kStageExec = 4,
  kStageUser = 5,
  kStageNamespace = 6,  // unshare or the propagation change
  kStagePrivateTmp = 7,
  kStageKeepVisible = 8,  // item: which of MountPlan::visible
  kStageDevShm = 9,
  kStageHideDevice = 10,  // item: which of MountPlan::hidden
  kStageRootfs = 11,      // a container's overlay root
};
struct ChildFailure {
  int32_t stage = 0;
  int32_t err = 0;
  int32_t item = 0;
};

// The workload's mount namespace, worked out before fork: the child may only make
// async-signal-safe calls, so every path it needs is ready.
struct MountPlan {
  std::string tmp;  // what /tmp and /var/tmp show: the workload's private tmp directory
  bool has_var_tmp = false;
  bool has_dev_shm = false;
  struct Visible {
    std::string path;                  // as the workload names it: /tmp/run1/data/workloads/w1
    std::vector<std::string> parents;  // to create in the private /tmp first, outermost first
  };
  std::vector<Visible> visible;
  std::string mask;  // an empty file of mode 0000 bound over each hidden device
  std::vector<std::string> hidden;
};

// Async-signal-safe "/proc/self/fd/N": a bind source that stays reachable once /tmp is covered.
struct FdPath {
  char text[32];
  explicit FdPath(int fd) {
    const char prefix[] = "/proc/self/fd/";
    size_t length = sizeof prefix - 1;
    for (size_t i = 0; i < length; ++i)
      text[i] = prefix[i];
    length += executor_internal::FormatDecimal(static_cast<unsigned>(fd), text + length);
    text[length] = '\0';
  }
};

constexpr size_t kMaxVisiblePaths = 16;

bool IsUnderTmp(const std::string& path) {
  return path.rfind("/tmp/", 0) == 0 || path.rfind("/var/tmp/", 0) == 0;
}

// Async-signal-safe: the child between fork and exec.
void ApplyMountPlan(const MountPlan& plan, int report);

template <typename... Args>
void Log(fmt::format_string<Args...> format, Args&&... args) {
  // shim.log is the shim's stderr; one line per event with wall-clock time.
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::tm parts{};
  ::gmtime_r(&now, &parts);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &parts);
  fmt::print(stderr, "{} shim[{}]: {}\n", stamp, ::getpid(),
             fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The executor passes /dev/null and shim.log as 0..2; make sure nothing we open lands there.
void EnsureStdFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd >= 0 && null_fd != fd) {
      ::dup2(null_fd, fd);
      ::close(null_fd);
    }
  }
}

void NotifyReady(int& ready_fd, std::string_view message) {
  if (ready_fd < 0) return;
  // The agent may be gone (SIGPIPE is ignored); nothing to do about a failed write.
  [[maybe_unused]] ssize_t ignored = ::write(ready_fd, message.data(), message.size());
  CloseFd(ready_fd);
}

// Async-signal-safe: the child between fork and exec.
[[noreturn]] void ChildFail(int report_fd, int32_t stage, int err, int32_t item = 0) {
  ChildFailure failure{stage, err, item};
  [[maybe_unused]] ssize_t ignored = ::write(report_fd, &failure, sizeof failure);
  ::_exit(127);
}

void ApplyMountPlan(const MountPlan& plan, int report) {
  // A namespace of its own, whose mounts never propagate back to the node (MS_SLAVE: the node's
  // later mounts still reach it).
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
    ChildFail(report, kStageNamespace, errno);
  // Opened in the new namespace (a bind source must be one of its mounts), before /tmp is
  // covered: the private tmp directory and the kept paths may lie under it. Closed at exec.
  const int tmp_fd = ::open(plan.tmp.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (tmp_fd < 0) ChildFail(report, kStagePrivateTmp, errno);
  int visible_fds[kMaxVisiblePaths];
  for (size_t i = 0; i < plan.visible.size(); ++i) {
    visible_fds[i] = ::open(plan.visible[i].path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (visible_fds[i] < 0) ChildFail(report, kStageKeepVisible, errno, static_cast<int32_t>(i));
  }
  const FdPath tmp_source(tmp_fd);
  if (::mount(tmp_source.text, "/tmp", nullptr, MS_BIND, nullptr) != 0 ||
      (plan.has_var_tmp && ::mount(tmp_source.text, "/var/tmp", nullptr, MS_BIND, nullptr) != 0))
    ChildFail(report, kStagePrivateTmp, errno);
  for (size_t i = 0; i < plan.visible.size(); ++i) {
    const MountPlan::Visible& entry = plan.visible[i];
    for (const std::string& parent : entry.parents)
      if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
        ChildFail(report, kStageKeepVisible, errno, static_cast<int32_t>(i));
    const FdPath source(visible_fds[i]);
    if ((::mkdir(entry.path.c_str(), 0755) != 0 && errno != EEXIST) ||
        ::mount(source.text, entry.path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      ChildFail(report, kStageKeepVisible, errno, static_cast<int32_t>(i));
  }
  if (plan.has_dev_shm &&
      ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0)
    ChildFail(report, kStageDevShm, errno);
  for (size_t i = 0; i < plan.hidden.size(); ++i)
    if (::mount(plan.mask.c_str(), plan.hidden[i].c_str(), nullptr, MS_BIND, nullptr) != 0)
      ChildFail(report, kStageHideDevice, errno, static_cast<int32_t>(i));
}

class Shim {
 public:
  Shim(std::string spec_path, int ready_fd)
      : spec_path_(std::move(spec_path)), ready_fd_(ready_fd) {}
  ~Shim() {
    CloseFd(ready_fd_);
    CloseFd(out_read_);
    CloseFd(err_read_);
    CloseFd(signal_fd_);
  }

  int Run();

 private:
  // Everything before the workload runs; on failure records failed_to_start.
  bool Start();
  void Supervise();
  void Finish();

  bool FailToStart(const std::string& error);
  std::optional<std::string> PlanMounts(MountPlan& plan);
  bool WriteFinalStatus();
  void Pump(int& fd, RotatingLogFile& log);
  void HandleSignals();
  void ReapChildren();
  void ReapMainProcess();
  void BeginTermination(bool cancelled, TimeMs grace_ms);
  void CheckCancelFile();
  void KillLeftovers();
  std::optional<TimeMs> NextDeadline() const;

  std::string spec_path_;
  int ready_fd_;
  ShimSpec spec_;
  WorkloadPaths paths_;
  std::unique_ptr<RotatingLogFile> stdout_log_;
  std::unique_ptr<RotatingLogFile> stderr_log_;
  int out_read_ = -1;
  int err_read_ = -1;
  int signal_fd_ = -1;
  sigset_t handled_signals_{};

  pid_t pid_ = 0;  // the workload's main process and process group
  bool main_done_ = false;
  int wait_status_ = 0;
  rusage usage_{};
  bool term_sent_ = false;
  bool kill_sent_ = false;
  std::optional<TimeMs> kill_at_;      // monotonic: SIGKILL the group then
  std::optional<TimeMs> runtime_end_;  // monotonic: max_runtime expires then
  FinalStatus final_;
  bool status_recorded_ = false;
  bool container_ = false;  // the spec names an image
  bool container_killed_ = false;
  ContainerStart container_start_;
};

int Shim::Run() {
  // Signals the shim handles are read from a signalfd. SIGTERM/SIGINT are blocked too, so a
  // stray signal (shutdown, an operator) cannot kill the supervisor and lose the exit status.
  sigemptyset(&handled_signals_);
  for (int signal_number : {SIGCHLD, SIGUSR1, SIGTERM, SIGINT, SIGQUIT})
    sigaddset(&handled_signals_, signal_number);
  ::sigprocmask(SIG_BLOCK, &handled_signals_, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);
  EnsureStdFds();
  if (ready_fd_ >= 0) ::fcntl(ready_fd_, F_SETFD, FD_CLOEXEC);
  // Orphaned descendants of the workload are re-parented to us, so we reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  bool exists = false;
  if (auto error = executor_internal::LoadStateFile(spec_path_, spec_, exists); error || !exists) {
    std::string why = error ? *error : fmt::format("'{}' does not exist", spec_path_);
    Log("cannot read the spec: {}", why);
    // Record the failure next to the spec, where the executor looks for it.
    size_t slash = spec_path_.rfind('/');
    paths_ = WorkloadPaths::For(slash == std::string::npos ? "." : spec_path_.substr(0, slash));
    FailToStart("the shim could not read its spec: " + why);
    return 1;
  }
  paths_ = WorkloadPaths::For(spec_.workload_dir);
  container_ = !spec_.container_id.empty();
  // Like any daemon: do not pin the agent's working directory (paths in the spec are absolute).
  if (::chdir("/") != 0) Log("chdir /: {}", ErrnoText(errno));
  if (!Start()) return status_recorded_ ? 0 : 1;
  Supervise();
  Finish();
  return WriteFinalStatus() ? 0 : 1;
}

bool Shim::FailToStart(const std::string& error) {
  Log("failed to start: {}", error);
  final_.state = WorkloadState::kFailedToStart;
  final_.error = error;
  final_.finished_at_ms = WallClockMs();
  if (!spec_.cgroup.dirs.empty()) {
    if (auto cleanup = RemoveCgroup(spec_.cgroup)) final_.cleanup_warning = *cleanup;
  }
  status_recorded_ = WriteFinalStatus();
  NotifyReady(ready_fd_, "failed\n");
  return status_recorded_;
}

bool Shim::WriteFinalStatus() {
  if (auto error = WriteFileAtomically(paths_.status, executor_internal::ToJson(final_))) {
    Log("cannot record the final status: {}", *error);
    return false;
  }
  return true;
}

bool Shim::Start() {
  auto self = executor_internal::ReadProcStat(::getpid());
  ProcessRecord shim_record{::getpid(), self ? self->start_ticks : 0, WallClockMs()};
  if (auto error = WriteFileAtomically(paths_.shim_pid, executor_internal::ToJson(shim_record))) {
    FailToStart("the shim could not record its pid: " + *error);
    return false;
  }

  const WorkloadSpec& workload = spec_.workload;
  stdout_log_ = std::make_unique<RotatingLogFile>(paths_.stdout_log, workload.logs);
  stderr_log_ = std::make_unique<RotatingLogFile>(paths_.stderr_log, workload.logs);
  for (RotatingLogFile* log : {stdout_log_.get(), stderr_log_.get()}) {
    if (auto error = log->Open()) {
      FailToStart(*error);
      return false;
    }
  }

  // The process seam: a plain process runs the workload's argv; a container runs the OCI
  // runtime over a bundle (container_runtime.h), which runs the argv inside.
  std::optional<std::string> executable;
  std::vector<std::string> exec_argv = workload.argv;
  std::vector<std::string> exec_env = spec_.env;
  if (container_) {
    auto progress = [&](const std::string& line) {
      Log("{}", line);
      if (line.rfind("pulling", 0) != 0 && line.rfind("preparing", 0) != 0) return;
      // The executor shows it as what the workload waits for, and stops waiting itself.
      if (auto error = WriteFileAtomically(paths_.phase, line)) Log("record the phase: {}", *error);
      NotifyReady(ready_fd_, "preparing\n");
    };
    if (auto error = PrepareContainerStart(spec_, paths_, container_start_, progress)) {
      FailToStart(*error);
      return false;
    }
    ::unlink(paths_.phase.c_str());
    if (::access(paths_.cancel.c_str(), F_OK) == 0) {
      FailToStart("cancelled while its image was prepared");
      return false;
    }
    // One of the same name left by a shim that was killed outright would block `run`.
    DeleteContainer(spec_);
    executable = container_start_.runtime;
    exec_argv = container_start_.argv;
    exec_env = {std::string("PATH=") + kShimPath};
    Log("{}", container_start_.description);
  } else {
    // Resolve the command as execvp would, with the workload's PATH: execvp itself is not
    // async-signal-safe, execve is.
    std::string path_env;
    for (const std::string& entry : spec_.env)
      if (entry.rfind("PATH=", 0) == 0) path_env = entry.substr(5);
    int resolve_error = 0;
    executable =
        executor_internal::ResolveCommand(workload.argv[0], path_env, spec_.workdir, resolve_error);
    if (!executable) {
      FailToStart(fmt::format("exec '{}': {} (searched PATH={})", workload.argv[0],
                              ErrnoText(resolve_error), path_env));
      return false;
    }
  }

  // Everything the child needs exists before fork: it may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& arg : exec_argv)
    argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : exec_env)
    envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  // The runtime runs in the bundle, as root: it switches to the container's user itself.
  const char* workdir = container_ ? container_start_.bundle.c_str() : spec_.workdir.c_str();
  const char* exec_path = executable->c_str();
  const std::optional<WorkloadUser>& run_as = container_ ? std::nullopt : workload.run_as;
  const std::vector<gid_t> groups =
      run_as ? std::vector<gid_t>(run_as->groups.begin(), run_as->groups.end())
             : std::vector<gid_t>();
  const bool container = container_;
  const char* rootfs = container_start_.rootfs.c_str();
  const char* overlay_options = container_start_.overlay_options.c_str();

  MountPlan mount_plan;
  if (auto error = container ? std::nullopt : PlanMounts(mount_plan)) {
    FailToStart(*error);
    return false;
  }

  std::vector<int> cgroup_fds;
  auto close_cgroup_fds = [&] {
    for (int& fd : cgroup_fds)
      CloseFd(fd);
  };
  // A container's runtime puts the container's init into the cgroup itself (cgroupsPath), and
  // removes the cgroup when it is done: it must not sit in it then.
  for (const std::string& file :
       container ? std::vector<std::string>() : CgroupProcsFiles(spec_.cgroup)) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      close_cgroup_fds();
      FailToStart(fmt::format("open '{}': {}", file, ErrnoText(err)));
      return false;
    }
    cgroup_fds.push_back(fd);
  }
  // Created before fork, so the child's exit cannot slip by unnoticed.
  signal_fd_ = ::signalfd(-1, &handled_signals_, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) {
    int err = errno;
    close_cgroup_fds();
    FailToStart(fmt::format("signalfd: {}", ErrnoText(err)));
    return false;
  }
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  int report_pipe[2] = {-1, -1};
  if (null_fd < 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(report_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    for (int* fd : {&null_fd, &out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1],
                    &report_pipe[0], &report_pipe[1]})
      CloseFd(*fd);
    close_cgroup_fds();
    FailToStart(fmt::format("set up pipes: {}", ErrnoText(err)));
    return false;
  }
  sigset_t child_mask;
  sigemptyset(&child_mask);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);

  pid_t child = ::fork();
  if (child == 0) {
    // Child: async-signal-safe calls only from here to execve.
    const int report = report_pipe[1];
    ::setpgid(0, 0);
    // Join the cgroup before exec: nothing the workload runs ever escapes its limits.
    for (int fd : cgroup_fds)
      if (::write(fd, "0", 1) != 1) ChildFail(report, kStageJoinCgroup, errno);
    if (::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(out_pipe[1], STDOUT_FILENO) < 0 ||
        ::dup2(err_pipe[1], STDERR_FILENO) < 0)
      ChildFail(report, kStageStdio, errno);
    // As root still: mounts need CAP_SYS_ADMIN, which the workload's user never has.
    if (workload.isolation.mount_namespace && !container) ApplyMountPlan(mount_plan, report);
    // The container's root: the image with a layer of its own on top, mounted in a namespace of
    // the runtime's, so it goes away with the container's last process.
    if (container && (::unshare(CLONE_NEWNS) != 0 ||
                      ::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0 ||
                      ::mount("overlay", rootfs, "overlay", 0, overlay_options) != 0))
      ChildFail(report, kStageRootfs, errno);
    // Groups, then gid, then uid: after setuid nothing else could be dropped. No new privileges
    // from then on: a setuid binary (sudo) does not make the workload root again.
    if (run_as && (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(run_as->gid) != 0 ||
                   ::setuid(run_as->uid) != 0 || ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0))
      ChildFail(report, kStageUser, errno);
    // As that user: a workdir it may not enter is a start failure, not a way around it.
    if (::chdir(workdir) != 0) ChildFail(report, kStageChdir, errno);
    // Ignored dispositions and the blocked mask would survive exec.
    ::sigaction(SIGPIPE, &default_action, nullptr);
    ::sigaction(SIGHUP, &default_action, nullptr);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    ::execve(exec_path, argv.data(), envp.data());
    ChildFail(report, kStageExec, errno);
  }
  int fork_error = errno;
  // Parent: also set the group, so it exists before we ever signal it, whichever runs first.
  if (child > 0) ::setpgid(child, child);
  for (int* fd : {&null_fd, &out_pipe[1], &err_pipe[1], &report_pipe[1]})
    CloseFd(*fd);
  close_cgroup_fds();
  out_read_ = out_pipe[0];
  err_read_ = err_pipe[0];
  if (child < 0) {
    CloseFd(report_pipe[0]);
    FailToStart(fmt::format("fork: {}", ErrnoText(fork_error)));
    return false;
  }
  pid_ = child;
  final_.pid = child;

  // EOF without a report: exec succeeded (the pipe closed on exec).
  ChildFailure failure;
  ssize_t got;
  do {
    got = ::read(report_pipe[0], &failure, sizeof failure);
  } while (got < 0 && errno == EINTR);
  CloseFd(report_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof failure)) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    std::string what;
    switch (failure.stage) {
      case kStageJoinCgroup:
        what = "join the workload's cgroup";
        break;
      case kStageStdio:
        what = "redirect stdin/stdout/stderr";
        break;
      case kStageChdir:
        what = fmt::format("chdir to workdir '{}'", spec_.workdir);
        if (run_as) what += " as " + run_as->name;
        break;
      case kStageUser:
        what = fmt::format("run as {} (uid {}, gid {})", run_as->name, run_as->uid, run_as->gid);
        break;
      case kStageNamespace:
        what = "create the workload's mount namespace";
        break;
      case kStagePrivateTmp:
        what = fmt::format("mount its private tmp directory {} on /tmp", mount_plan.tmp);
        break;
      case kStageKeepVisible:
        what = fmt::format("keep {} visible under its private /tmp",
                           static_cast<size_t>(failure.item) < mount_plan.visible.size()
                               ? mount_plan.visible[static_cast<size_t>(failure.item)].path
                               : "a path");
        break;
      case kStageDevShm:
        what = "mount a private /dev/shm";
        break;
      case kStageRootfs:
        what = fmt::format("mount the container's root {} ({})", container_start_.rootfs,
                           container_start_.overlay_options);
        break;
      case kStageHideDevice:
        what = fmt::format("hide {}", static_cast<size_t>(failure.item) < mount_plan.hidden.size()
                                          ? mount_plan.hidden[static_cast<size_t>(failure.item)]
                                          : "a GPU device");
        break;
      default:
        what = workload.argv[0] == *executable
                   ? fmt::format("exec '{}'", workload.argv[0])
                   : fmt::format("exec '{}' ({})", workload.argv[0], *executable);
    }
    pid_ = 0;
    FailToStart(fmt::format("{}: {}", what, ErrnoText(failure.err)));
    return false;
  }

  final_.started_at_ms = WallClockMs();
  auto child_stat = executor_internal::ReadProcStat(child);
  ProcessRecord workload_record{child, child_stat ? child_stat->start_ticks : 0,
                                final_.started_at_ms};
  if (auto error =
          WriteFileAtomically(paths_.workload_pgid, executor_internal::ToJson(workload_record)))
    Log("cannot record the workload pid (cancel after an agent restart will not find it): {}",
        *error);
  if (workload.max_runtime > 0) runtime_end_ = MonotonicMs() + workload.max_runtime;
  Log("started workload '{}' pid {} ({})", workload.id, child, *executable);
  NotifyReady(ready_fd_, "running\n");
  // A cancel that arrived before we could be signalled (see Executor::Cancel).
  CheckCancelFile();
  return true;
}

std::optional<std::string> Shim::PlanMounts(MountPlan& plan) {
  const WorkloadIsolation& isolation = spec_.workload.isolation;
  if (!isolation.mount_namespace) return std::nullopt;
  plan.tmp = paths_.tmp;
  struct stat info {};
  plan.has_var_tmp = ::stat("/var/tmp", &info) == 0 && S_ISDIR(info.st_mode);
  plan.has_dev_shm = ::stat("/dev/shm", &info) == 0 && S_ISDIR(info.st_mode);

  std::vector<std::string> wanted = {spec_.workload_dir, spec_.workdir};
  wanted.insert(wanted.end(), isolation.keep_visible.begin(), isolation.keep_visible.end());
  for (const std::string& path : wanted) {
    if (!IsUnderTmp(path)) continue;  // not covered by the private /tmp
    if (std::any_of(plan.visible.begin(), plan.visible.end(),
                    [&](const MountPlan::Visible& entry) { return entry.path == path; }))
      continue;
    if (plan.visible.size() == kMaxVisiblePaths) {
      Log("not kept visible under the private /tmp (more than {} paths): {}", kMaxVisiblePaths,
          path);
      continue;
    }
    struct stat dir_info {};
    if (::stat(path.c_str(), &dir_info) != 0 || !S_ISDIR(dir_info.st_mode)) {
      // Nothing there to keep: the workload would not have found it anyway.
      Log("not kept visible under the private /tmp: {}: not a directory", path);
      continue;
    }
    MountPlan::Visible entry;
    entry.path = path;
    const size_t root_end = path.rfind("/var/tmp/", 0) == 0 ? 8 : 4;
    for (size_t slash = path.find('/', root_end + 1); slash != std::string::npos;
         slash = path.find('/', slash + 1))
      entry.parents.push_back(path.substr(0, slash));
    plan.visible.push_back(std::move(entry));
  }

  plan.mask = spec_.workload_dir + "/device-mask";
  int mask_fd = ::open(plan.mask.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0);
  if (mask_fd < 0 || ::fchmod(mask_fd, 0) != 0) {
    int err = errno;
    if (mask_fd >= 0) ::close(mask_fd);
    return fmt::format("create the device mask '{}': {}", plan.mask, ErrnoText(err));
  }
  ::close(mask_fd);
  for (const std::string& device : isolation.hidden_devices) {
    if (::lstat(device.c_str(), &info) != 0) continue;  // absent: nothing to open
    plan.hidden.push_back(device);
  }
  Log("mount namespace: private /tmp{}{}, {} device(s) hidden, {} path(s) kept visible",
      plan.has_var_tmp ? " and /var/tmp" : "", plan.has_dev_shm ? " and /dev/shm" : "",
      plan.hidden.size(), plan.visible.size());
  return std::nullopt;
}

std::optional<TimeMs> Shim::NextDeadline() const {
  std::optional<TimeMs> next;
  if (kill_at_ && !kill_sent_) next = kill_at_;
  if (runtime_end_ && !term_sent_) next = next ? std::min(*next, *runtime_end_) : *runtime_end_;
  return next;
}

void Shim::Pump(int& fd, RotatingLogFile& log) {
  char buffer[kPipeReadBytes];
  ssize_t got = ::read(fd, buffer, sizeof buffer);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    CloseFd(fd);
    return;
  }
  if (auto error = log.Write(std::string_view(buffer, static_cast<size_t>(got))))
    Log("log write failed, output dropped: {}", *error);
}

void Shim::ReapChildren() {
  // The main process is only noticed here (WNOWAIT), not reaped: while it is an unreaped zombie
  // its pid, and so its process group's number, cannot be reused, which keeps every later
  // kill(-pid_) aimed at our group. It is reaped last, in ReapMainProcess().
  while (!main_done_) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (info.si_pid == 0) return;  // nothing has exited
    if (info.si_pid == pid_) {
      main_done_ = true;
      final_.finished_at_ms = WallClockMs();
      return;
    }
    // Orphaned descendants re-parented to us (we are a subreaper): just reaped.
    ::waitpid(info.si_pid, nullptr, WNOHANG);
  }
}

void Shim::ReapMainProcess() {
  while (::wait4(pid_, &wait_status_, 0, &usage_) < 0 && errno == EINTR) {
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

void Shim::BeginTermination(bool cancelled, TimeMs grace_ms) {
  if (main_done_ || pid_ <= 0) return;
  if (cancelled)
    final_.cancelled = true;
  else
    final_.timed_out = true;
  if (grace_ms <= 0) {
    // No grace: straight to SIGKILL, as `kill -9` would.
    if (!kill_sent_) {
      kill_sent_ = true;
      Log("{}: SIGKILL to process group {} (no grace period)", cancelled ? "cancel" : "max runtime",
          pid_);
      KillLeftovers();
    }
    term_sent_ = true;
    return;
  }
  TimeMs deadline = MonotonicMs() + grace_ms;
  kill_at_ = kill_at_ ? std::min(*kill_at_, deadline) : deadline;
  if (!term_sent_) {
    term_sent_ = true;
    Log("{}: SIGTERM to process group {}, SIGKILL in {} ms", cancelled ? "cancel" : "max runtime",
        pid_, grace_ms);
    ::kill(-pid_, SIGTERM);
  }
}

void Shim::CheckCancelFile() {
  executor_internal::CancelRequest request;
  bool exists = false;
  auto error = executor_internal::LoadStateFile(paths_.cancel, request, exists);
  if (!exists) return;
  if (error) {
    Log("unreadable cancel request ({}); using the spec's grace period", *error);
    request.grace_ms = spec_.workload.grace_period;
  }
  BeginTermination(true, request.grace_ms);
}

void Shim::HandleSignals() {
  signalfd_siginfo info{};
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    switch (info.ssi_signo) {
      case SIGCHLD:
        ReapChildren();
        break;
      case SIGUSR1:
        CheckCancelFile();
        break;
      default:
        Log("ignoring signal {} from pid {}", info.ssi_signo, info.ssi_pid);
    }
  }
}

void Shim::KillLeftovers() {
  if (pid_ <= 0) return;  // kill(-0) would hit the shim's own group
  ::kill(-pid_, SIGKILL);
  for (int32_t member : CgroupMembers(spec_.cgroup))
    ::kill(member, SIGKILL);
  // Without a cgroup of ours, the container's processes are found through the runtime only.
  if (container_ && spec_.cgroup.dirs.empty() && !container_killed_) {
    container_killed_ = true;
    KillContainer(spec_);
  }
}

void Shim::Supervise() {
  // A SIGCHLD that came before the signalfd existed is still pending and shows up here.
  while (!main_done_) {
    std::optional<TimeMs> deadline = NextDeadline();
    int timeout = -1;
    if (deadline) timeout = static_cast<int>(std::max<TimeMs>(0, *deadline - MonotonicMs()));
    pollfd fds[3] = {{signal_fd_, POLLIN, 0}, {out_read_, POLLIN, 0}, {err_read_, POLLIN, 0}};
    int ready = ::poll(fds, 3, timeout);
    if (ready < 0 && errno != EINTR) {
      Log("poll: {}", ErrnoText(errno));
      ::usleep(10'000);
    }
    if (ready > 0) {
      if (fds[1].revents != 0) Pump(out_read_, *stdout_log_);
      if (fds[2].revents != 0) Pump(err_read_, *stderr_log_);
      if (fds[0].revents != 0) HandleSignals();
    }
    if (main_done_) break;
    TimeMs now = MonotonicMs();
    if (runtime_end_ && !term_sent_ && now >= *runtime_end_)
      BeginTermination(false, spec_.workload.grace_period);
    if (kill_at_ && !kill_sent_ && now >= *kill_at_) {
      kill_sent_ = true;
      Log("grace period over: SIGKILL to process group {}", pid_);
      KillLeftovers();
    }
  }
}

void Shim::Finish() {
  Log("workload pid {} ended", pid_);
  // A task is over when its main process is: whatever it left running in its process group or
  // cgroup goes too (as with a container's init), freeing its GPUs and closing its pipes.
  KillLeftovers();
  const TimeMs drain_until = MonotonicMs() + kDrainTimeoutMs;
  while ((out_read_ >= 0 || err_read_ >= 0) && MonotonicMs() < drain_until) {
    pollfd fds[3] = {{signal_fd_, POLLIN, 0}, {out_read_, POLLIN, 0}, {err_read_, POLLIN, 0}};
    int ready = ::poll(fds, 3, static_cast<int>(kDrainPollMs));
    if (ready > 0) {
      if (fds[1].revents != 0) Pump(out_read_, *stdout_log_);
      if (fds[2].revents != 0) Pump(err_read_, *stderr_log_);
      if (fds[0].revents != 0) HandleSignals();
    } else {
      KillLeftovers();  // something started since, or was still exiting
    }
  }
  if (out_read_ >= 0 || err_read_ >= 0) {
    final_.cleanup_warning =
        "processes outside the workload's process group still hold its "
        "output open; stopped reading after the workload ended";
    Log("{}", final_.cleanup_warning);
    CloseFd(out_read_);
    CloseFd(err_read_);
  }
  ReapMainProcess();
  if (container_) {
    // `run` removes its container when it exits itself; not when it was killed.
    DeleteContainer(spec_);
    if (container_start_.image.lock_fd >= 0) ::close(container_start_.image.lock_fd);
    container_start_.image.lock_fd = -1;
    std::error_code ignored;
    for (const std::string& dir : {paths_.upper, paths_.overlay_work, paths_.rootfs})
      std::filesystem::remove_all(dir, ignored);
  }
  final_.state = WorkloadState::kExited;
  if (WIFEXITED(wait_status_)) {
    final_.exit_code = WEXITSTATUS(wait_status_);
  } else if (WIFSIGNALED(wait_status_)) {
    final_.signal = WTERMSIG(wait_status_);
    final_.core_dumped = WCOREDUMP(wait_status_);
  }
  final_.killed_after_grace = kill_sent_ && final_.signal == SIGKILL;
  auto cpu_ms = [](const timeval& time) {
    return static_cast<TimeMs>(time.tv_sec) * 1000 + time.tv_usec / 1000;
  };
  // Of the main process and the descendants it waited for.
  final_.user_cpu_ms = cpu_ms(usage_.ru_utime);
  final_.system_cpu_ms = cpu_ms(usage_.ru_stime);
  final_.max_rss_kib = usage_.ru_maxrss;
  Log("workload pid {}: {}", pid_,
      final_.exit_code ? fmt::format("exit code {}", *final_.exit_code)
                       : fmt::format("signal {}", final_.signal.value_or(0)));
  final_.log_bytes_dropped = stdout_log_->bytes_dropped() + stderr_log_->bytes_dropped();
  if (!spec_.cgroup.dirs.empty()) {
    final_.oom_killed = CgroupOomKills(spec_.cgroup).value_or(0) > 0;
    if (auto error = RemoveCgroup(spec_.cgroup)) {
      std::string warning = "cgroup not removed: " + *error;
      Log("{}", warning);
      final_.cleanup_warning += final_.cleanup_warning.empty() ? warning : "; " + warning;
    }
  }
}

}  // namespace

int RunShim(const std::string& spec_path, int ready_fd) {
  Shim shim(spec_path, ready_fd);
  return shim.Run();
}

int RunShim(int argc, char** argv) {
  std::string spec_path;
  int ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (i + 1 >= argc) {
      fmt::print(stderr, "agent-shim: '{}' needs a value\n", arg);
      return 2;
    }
    std::string_view value = argv[++i];
    if (arg == "--spec") {
      spec_path = value;
    } else if (arg == "--ready-fd") {
      if (std::from_chars(value.data(), value.data() + value.size(), ready_fd).ec != std::errc() ||
          ready_fd < 0) {
        fmt::print(stderr, "agent-shim: bad --ready-fd '{}'\n", value);
        return 2;
      }
    } else {
      fmt::print(stderr, "agent-shim: unknown argument '{}'\n", arg);
      return 2;
    }
  }
  if (spec_path.empty()) {
    fmt::print(stderr, "usage: agent-shim --spec <spec.json> [--ready-fd <fd>]\n");
    return 2;
  }
  return RunShim(spec_path, ready_fd);
}

}  // namespace gpufleet::agent
