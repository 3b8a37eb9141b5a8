#include "agent/command_runner.h"

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/executor_util.h"

namespace gpufleet::agent {
namespace {

constexpr size_t kMaxOutputBytes = 16 * 1024;

std::string LastLines(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' '))
    trimmed.pop_back();
  // Error messages carry the end: the last 3 lines, each line break shown as " | ".
  size_t start = trimmed.size();
  for (int lines = 0; lines < 3 && start != std::string::npos && start > 0; ++lines)
    start = trimmed.rfind('\n', start - 1);
  std::string tail = start == std::string::npos ? trimmed : trimmed.substr(start + 1);
  for (char& c : tail)
    if (c == '\n') c = '|';
  return tail;
}

}  // namespace

std::string CommandResult::Describe() const {
  if (!started) return output;
  std::string what = timed_out        ? std::string("timed out")
                     : exit_code >= 0 ? fmt::format("exit code {}", exit_code)
                                      : std::string("killed by a signal");
  std::string tail = LastLines(output);
  return tail.empty() ? what : what + ": " + tail;
}

CommandResult RunCommand(const std::vector<std::string>& argv, TimeMs timeout_ms) {
  CommandResult result;
  if (argv.empty() || argv[0].empty()) {
    result.output = "no command";
    return result;
  }
  int output_pipe[2] = {-1, -1};
  int report_pipe[2] = {-1, -1};
  if (::pipe2(output_pipe, O_CLOEXEC) != 0 || ::pipe2(report_pipe, O_CLOEXEC) != 0) {
    result.output = fmt::format("pipe: {}", std::strerror(errno));
    for (int fd : {output_pipe[0], output_pipe[1], report_pipe[0], report_pipe[1]})
      if (fd >= 0) ::close(fd);
    return result;
  }
  std::vector<char*> args;
  for (const std::string& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  pid_t child = ::fork();
  if (child == 0) {
    // Async-signal-safe calls only: the caller may have threads.
    ::setpgid(0, 0);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(output_pipe[1], 1);
    ::dup2(output_pipe[1], 2);
    ::sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::execvp(args[0], args.data());
    int err = errno;
    [[maybe_unused]] ssize_t ignored = ::write(report_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_error = errno;
  ::close(output_pipe[1]);
  ::close(report_pipe[1]);
  if (child < 0) {
    ::close(output_pipe[0]);
    ::close(report_pipe[0]);
    result.output = fmt::format("fork: {}", std::strerror(fork_error));
    return result;
  }
  int exec_error = 0;
  ssize_t got;
  do {
    got = ::read(report_pipe[0], &exec_error, sizeof exec_error);
  } while (got < 0 && errno == EINTR);
  ::close(report_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof exec_error)) {
    while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    ::close(output_pipe[0]);
    result.output = fmt::format("run '{}': {}", argv[0], std::strerror(exec_error));
    return result;
  }
  result.started = true;
  const TimeMs deadline = executor_internal::MonotonicMs() + timeout_ms;
  char buffer[4096];
  for (;;) {
    TimeMs left = deadline - executor_internal::MonotonicMs();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(-child, SIGKILL);
      break;
    }
    pollfd fds{output_pipe[0], POLLIN, 0};
    int ready = ::poll(&fds, 1, static_cast<int>(std::min<TimeMs>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    got = ::read(output_pipe[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    result.output.append(buffer, static_cast<size_t>(got));
    if (result.output.size() > 2 * kMaxOutputBytes)
      result.output.erase(0, result.output.size() - kMaxOutputBytes);
  }
  ::close(output_pipe[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (result.output.size() > kMaxOutputBytes)
    result.output.erase(0, result.output.size() - kMaxOutputBytes);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace gpufleet::agent
