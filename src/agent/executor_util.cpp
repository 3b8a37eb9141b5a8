#include "agent/executor_util.h"

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <ctime>

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpufleet::agent::executor_internal {

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto text = ReadFileToString(fmt::format("/proc/{}/stat", pid));
  if (!text) return std::nullopt;
  // "pid (comm) state ppid pgrp ..." where comm may hold spaces and ')': fields follow the last
  // ')'.
  size_t close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string_view> fields;
  std::string_view rest = std::string_view(*text).substr(close + 1);
  while (!rest.empty()) {
    size_t start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    rest.remove_prefix(start);
    size_t end = rest.find(' ');
    fields.push_back(rest.substr(0, end));
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end);
  }
  // fields[0] is field 3 (state); start time is field 22.
  constexpr size_t kStartTimeIndex = 22 - 3;
  if (fields.size() <= kStartTimeIndex || fields[0].empty()) return std::nullopt;
  ProcStat stat;
  stat.state = fields[0][0];
  auto parse = [](std::string_view field, auto& value) {
    return std::from_chars(field.data(), field.data() + field.size(), value).ec == std::errc();
  };
  if (!parse(fields[1], stat.ppid) || !parse(fields[2], stat.pgrp) ||
      !parse(fields[kStartTimeIndex], stat.start_ticks))
    return std::nullopt;
  return stat;
}

namespace {
bool IsZombie(char state) {
  return state == 'Z' || state == 'X' || state == 'x';
}
}  // namespace

bool IsLiveProcess(pid_t pid, uint64_t start_ticks) {
  auto stat = ReadProcStat(pid);
  return stat && !IsZombie(stat->state) && stat->start_ticks == start_ticks;
}

std::vector<pid_t> LiveGroupMembers(pid_t pgid, uint64_t leader_start_ticks) {
  std::vector<pid_t> members;
  if (pgid <= 0) return members;
  if (auto leader = ReadProcStat(pgid); leader && leader->start_ticks != leader_start_ticks)
    return members;  // the number was reused: that group is not ours
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return members;
  while (dirent* entry = ::readdir(proc)) {
    pid_t pid = 0;
    std::string_view name = entry->d_name;
    if (std::from_chars(name.data(), name.data() + name.size(), pid).ec != std::errc() || pid <= 0)
      continue;
    auto stat = ReadProcStat(pid);
    if (stat && stat->pgrp == pgid && !IsZombie(stat->state)) members.push_back(pid);
  }
  ::closedir(proc);
  return members;
}

std::string ErrnoText(int err) {
  return std::strerror(err);
}

TimeMs WallClockMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

TimeMs MonotonicMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

std::optional<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string content;
  char buffer[4096];
  while (true) {
    ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int err = errno;
      ::close(fd);
      errno = err;
      return std::nullopt;
    }
    if (got == 0) break;
    content.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  return content;
}

namespace {
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return false;
    data.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}
}  // namespace

std::optional<std::string> WriteFileAtomically(const std::string& path, std::string_view content) {
  // Unique per process and call: concurrent executor threads may write the same file.
  static std::atomic<uint64_t> counter{0};
  std::string temp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  // A workload's spec holds its environment (tokens, often): the agent's alone.
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("create '{}': {}", temp, ErrnoText(errno));
  if (!WriteAll(fd, content) || ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    return fmt::format("write '{}': {}", temp, ErrnoText(err));
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    return fmt::format("rename '{}' to '{}': {}", temp, path, ErrnoText(err));
  }
  return std::nullopt;
}

std::optional<std::string> WriteKernelFile(const std::string& path, std::string_view value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("open '{}': {}", path, ErrnoText(errno));
  ssize_t written;
  do {
    written = ::write(fd, value.data(), value.size());
  } while (written < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (written < 0) return fmt::format("write '{}' to '{}': {}", value, path, ErrnoText(err));
  if (static_cast<size_t>(written) != value.size())
    return fmt::format("write '{}' to '{}': short write", value, path);
  return std::nullopt;
}

size_t FormatDecimal(unsigned value, char* out) {
  char digits[10];
  size_t count = 0;
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  for (size_t i = 0; i < count; ++i)
    out[i] = digits[count - 1 - i];
  return count;
}

std::optional<std::string> ResolveCommand(const std::string& command, const std::string& path_env,
                                          const std::string& workdir, int& err) {
  err = 0;
  if (command.empty()) {
    err = ENOENT;
    return std::nullopt;
  }
  if (command.find('/') != std::string::npos) return command;
  auto from_workdir = [&](const std::string& path) {
    return path.empty() || path[0] == '/' || workdir.empty() ? path : workdir + "/" + path;
  };
  bool saw_denied = false;
  size_t begin = 0;
  while (begin <= path_env.size()) {
    size_t end = path_env.find(':', begin);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(begin, end - begin);
    begin = end + 1;
    // An empty PATH entry means the current directory, as for execvp.
    std::string candidate = dir.empty() ? command : dir + "/" + command;
    std::string on_disk = from_workdir(candidate);
    struct stat info {};
    if (::stat(on_disk.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    if (::access(on_disk.c_str(), X_OK) != 0) {
      saw_denied = true;
      continue;
    }
    return on_disk;
  }
  err = saw_denied ? EACCES : ENOENT;
  return std::nullopt;
}

}  // namespace gpufleet::agent::executor_internal
