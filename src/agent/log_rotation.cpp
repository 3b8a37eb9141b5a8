#include "agent/log_rotation.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpufleet::agent {
namespace {

constexpr int32_t kMaxKeepFiles = 1000;

std::string ErrorText(int err) {
  return std::strerror(err);
}

}  // namespace

std::optional<std::string> ValidateLogLimits(const LogLimits& limits) {
  if (limits.rotate_bytes < 0)
    return fmt::format("rotate_bytes {} is negative", limits.rotate_bytes);
  if (limits.keep_files < 0 || limits.keep_files > kMaxKeepFiles)
    return fmt::format("keep_files {} is outside 0..{}", limits.keep_files, kMaxKeepFiles);
  return std::nullopt;
}

RotatingLogFile::RotatingLogFile(std::string path, LogLimits limits)
    : path_(std::move(path)), limits_(limits) {}

RotatingLogFile::~RotatingLogFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RotatingLogFile::RotatedPath(const std::string& path, int32_t index) {
  return fmt::format("{}.{}", path, index);
}

std::optional<std::string> RotatingLogFile::Open() {
  if (fd_ >= 0) return std::nullopt;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return fmt::format("open log '{}': {}", path_, ErrorText(errno));
  struct stat info {};
  size_ = ::fstat(fd_, &info) == 0 ? info.st_size : 0;
  return std::nullopt;
}

std::optional<std::string> RotatingLogFile::Append(std::string_view data) {
  while (!data.empty()) {
    ssize_t written = ::write(fd_, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      bytes_dropped_ += static_cast<int64_t>(data.size());
      return fmt::format("write log '{}': {}", path_, ErrorText(err));
    }
    size_ += written;
    bytes_written_ += written;
    data.remove_prefix(static_cast<size_t>(written));
  }
  return std::nullopt;
}

std::optional<std::string> RotatingLogFile::Rotate() {
  ::close(fd_);
  fd_ = -1;
  if (limits_.keep_files == 0) {
    ::unlink(path_.c_str());
  } else {
    // Shift .N-1 -> .N ... .1 -> .2, live -> .1; rename replaces (and so deletes) the oldest.
    for (int32_t index = limits_.keep_files - 1; index >= 1; --index) {
      std::string from = RotatedPath(path_, index);
      std::string to = RotatedPath(path_, index + 1);
      if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT)
        return fmt::format("rotate '{}' to '{}': {}", from, to, ErrorText(errno));
    }
    std::string first = RotatedPath(path_, 1);
    if (::rename(path_.c_str(), first.c_str()) != 0 && errno != ENOENT)
      return fmt::format("rotate '{}' to '{}': {}", path_, first, ErrorText(errno));
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return fmt::format("reopen log '{}': {}", path_, ErrorText(errno));
  size_ = 0;
  return std::nullopt;
}

std::optional<std::string> RotatingLogFile::Write(std::string_view data) {
  if (fd_ < 0) {
    if (auto error = Open()) {
      bytes_dropped_ += static_cast<int64_t>(data.size());
      return error;
    }
  }
  while (!data.empty()) {
    if (limits_.rotate_bytes == 0 ||
        static_cast<int64_t>(data.size()) <= limits_.rotate_bytes - size_)
      return Append(data);

    const int64_t room = limits_.rotate_bytes - size_;
    size_t cut = std::string_view::npos;
    if (room > 0) cut = data.substr(0, static_cast<size_t>(room)).rfind('\n');
    std::string_view head;
    if (cut != std::string_view::npos) {
      head = data.substr(0, cut + 1);  // whole lines that still fit
    } else if (size_ == 0) {
      head = data.substr(0, static_cast<size_t>(room));  // one line longer than a whole file
    }
    if (!head.empty()) {
      if (auto error = Append(head)) {
        bytes_dropped_ += static_cast<int64_t>(data.size() - head.size());
        return error;
      }
      data.remove_prefix(head.size());
    }
    if (auto error = Rotate()) {
      bytes_dropped_ += static_cast<int64_t>(data.size());
      return error;
    }
  }
  return std::nullopt;
}

}  // namespace gpufleet::agent
