#include "agent/gpu_sharing.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/executor_util.h"

extern char** environ;

namespace gpufleet::agent {
namespace {

using executor_internal::ErrnoText;

// How long the control binary may take to answer or to daemonize.
constexpr auto kControlTimeout = std::chrono::seconds(10);

struct ControlRun {
  int exit_code = -1;  // -1: it could not be run or did not finish in time
  std::string error;   // why not, when exit_code is -1
};

// Runs `binary args...` with the MPS directories in its environment and `input` on its stdin,
// its output discarded.
ControlRun RunControl(const std::string& binary, const std::vector<std::string>& args,
                      const std::string& input, const std::string& pipe_directory,
                      const std::string& log_directory) {
  ControlRun run;
  std::vector<std::string> env_strings = {"CUDA_MPS_PIPE_DIRECTORY=" + pipe_directory,
                                          "CUDA_MPS_LOG_DIRECTORY=" + log_directory};
  for (char** entry = environ; *entry; ++entry) {
    std::string_view variable(*entry);
    if (!variable.starts_with("CUDA_MPS_")) env_strings.emplace_back(variable);
  }
  std::vector<char*> envp;
  for (std::string& entry : env_strings)
    envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings)
    argv.push_back(arg.data());
  argv.push_back(nullptr);

  int stdin_pipe[2];
  if (::pipe2(stdin_pipe, O_CLOEXEC) != 0) {
    run.error = "pipe: " + ErrnoText(errno);
    return run;
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, stdin_pipe[0], 0);
  ::posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t child = 0;
  const int spawned =
      ::posix_spawn(&child, binary.c_str(), &actions, nullptr, argv.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(stdin_pipe[0]);
  if (spawned != 0) {
    ::close(stdin_pipe[1]);
    run.error = fmt::format("cannot run {}: {}", binary, ErrnoText(spawned));
    return run;
  }
  // A few bytes: the pipe's buffer takes them whether or not the child reads. Should the write
  // fail, the control program reads no command and its exit code says so.
  if (!input.empty() && ::write(stdin_pipe[1], input.data(), input.size()) < 0) run.error.clear();
  ::close(stdin_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + kControlTimeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) {
      if (WIFEXITED(status)) {
        run.exit_code = WEXITSTATUS(status);
      } else {
        run.error = fmt::format("{} was killed by signal {}", binary, WTERMSIG(status));
      }
      return run;
    }
    if (done < 0 && errno != EINTR) {
      run.error = "waitpid: " + ErrnoText(errno);
      return run;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      run.error =
          fmt::format("{} did not finish within {} s", binary,
                      std::chrono::duration_cast<std::chrono::seconds>(kControlTimeout).count());
      return run;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::string_view GpuSharingModeName(GpuSharingMode mode) {
  switch (mode) {
    case GpuSharingMode::kAuto:
      return "auto";
    case GpuSharingMode::kMps:
      return "mps";
    case GpuSharingMode::kRecorded:
      return "recorded";
    case GpuSharingMode::kAdvisory:
      return "advisory";
  }
  return "auto";
}

std::optional<GpuSharingMode> ParseGpuSharingMode(std::string_view name) {
  for (GpuSharingMode mode : {GpuSharingMode::kAuto, GpuSharingMode::kMps,
                              GpuSharingMode::kRecorded, GpuSharingMode::kAdvisory})
    if (name == GpuSharingModeName(mode)) return mode;
  return std::nullopt;
}

GpuShareLimits ShareLimits(MilliGpu share, const std::vector<MiB>& memory_total_mib) {
  GpuShareLimits limits;
  const MilliGpu clamped = std::clamp<MilliGpu>(share, 1, kMilliPerGpu);
  limits.compute_percent = std::clamp((clamped + 9) / 10, 1, 100);
  for (MiB total : memory_total_mib)
    limits.memory_limit_mib.push_back(total * clamped / kMilliPerGpu);
  return limits;
}

std::string PinnedMemoryLimitValue(const std::vector<MiB>& memory_limit_mib) {
  std::string value;
  for (size_t ordinal = 0; ordinal < memory_limit_mib.size(); ++ordinal)
    value += fmt::format("{}{}={}M", ordinal == 0 ? "" : ",", ordinal, memory_limit_mib[ordinal]);
  return value;
}

MpsDaemon::MpsDaemon(std::string root, std::string control_binary)
    : pipe_directory_(root + "/pipe"),
      log_directory_(root + "/log"),
      control_binary_(std::move(control_binary)) {}

std::optional<std::string> MpsDaemon::FindControlBinary(const std::string& control_binary) {
  int err = 0;
  const char* path = std::getenv("PATH");
  auto found = executor_internal::ResolveCommand(
      control_binary, path ? path : "/usr/local/bin:/usr/bin:/bin", "/", err);
  // A path with a '/' comes back as given: it must exist and be executable all the same.
  if (found && ::access(found->c_str(), X_OK) != 0) return std::nullopt;
  return found;
}

bool MpsDaemon::Running() const {
  auto binary = FindControlBinary(control_binary_);
  if (!binary) return false;
  // The documented way to ask: a command on the control program's stdin, which fails ("Cannot
  // find MPS control daemon process") when no daemon serves this pipe directory.
  return RunControl(*binary, {}, "get_server_list\n", pipe_directory_, log_directory_).exit_code ==
         0;
}

std::optional<std::string> MpsDaemon::EnsureRunning() {
  auto binary = FindControlBinary(control_binary_);
  if (!binary)
    return fmt::format(
        "CUDA MPS: {} not found in PATH (install NVIDIA's MPS tools, or start the "
        "agent with --gpu-sharing advisory)",
        control_binary_);
  std::lock_guard lock(start_mutex_);
  if (Running()) return std::nullopt;
  std::error_code error;
  for (const std::string& directory : {pipe_directory_, log_directory_}) {
    std::filesystem::create_directories(directory, error);
    if (error) return fmt::format("CUDA MPS: cannot create {}: {}", directory, error.message());
  }
  // Clients of any user must reach the pipes; the logs are the agent's.
  ::chmod(pipe_directory_.c_str(), 0755);
  ::chmod(log_directory_.c_str(), 0750);
  const ControlRun started = RunControl(*binary, {"-d"}, "", pipe_directory_, log_directory_);
  if (started.exit_code != 0)
    return started.exit_code < 0
               ? "CUDA MPS: " + started.error
               : fmt::format("CUDA MPS: {} -d exited with {} (see {}/control.log)", *binary,
                             started.exit_code, log_directory_);
  // -d returns once the daemon has forked; it answers shortly after.
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (Running()) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return fmt::format(
      "CUDA MPS: the control daemon started by {} -d does not answer on {} (see "
      "{}/control.log)",
      *binary, pipe_directory_, log_directory_);
}

}  // namespace gpufleet::agent
