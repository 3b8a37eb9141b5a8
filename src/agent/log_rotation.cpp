#include "agent/log_rotation.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

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

struct OffsetRecord {
  uint64_t generation = 0;
  int64_t live_start = 0;
  bool operator==(const OffsetRecord&) const = default;
};

// A missing or unreadable record reads as generation 0, start 0: a log never rotated.
OffsetRecord ReadOffsetRecord(const std::string& log_path) {
  OffsetRecord record;
  const std::string path = RotatingLogFile::OffsetRecordPath(log_path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return record;
  char text[64] = {};
  ssize_t got = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (got <= 0) return record;
  const char* end = text + got;
  auto [after_generation, first] = std::from_chars(text, end, record.generation);
  if (first != std::errc() || after_generation >= end || *after_generation != ' ') return {};
  auto [after_start, second] = std::from_chars(after_generation + 1, end, record.live_start);
  if (second != std::errc()) return {};
  return record;
}

}  // namespace

std::optional<std::string> ValidateLogLimits(const LogLimits& limits) {
  if (limits.rotate_bytes < 0)
    return fmt::format("rotate_bytes {} is negative", limits.rotate_bytes);
  if (limits.keep_files < 0 || limits.keep_files > kMaxKeepFiles)
    return fmt::format("keep_files {} is outside 0..{}", limits.keep_files, kMaxKeepFiles);
  if (limits.max_line_bytes < 0)
    return fmt::format("max_line_bytes {} is negative", limits.max_line_bytes);
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

std::string RotatingLogFile::OffsetRecordPath(const std::string& path) {
  return path + ".offset";
}

std::optional<std::string> RotatingLogFile::Open() {
  if (fd_ >= 0) return std::nullopt;
  // The agent's to read (and serve to those allowed), not other users' on the node.
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) return fmt::format("open log '{}': {}", path_, ErrorText(errno));
  struct stat info {};
  size_ = ::fstat(fd_, &info) == 0 ? info.st_size : 0;
  // Appending to a log rotated before (by an earlier writer): its offsets go on from there.
  const OffsetRecord record = ReadOffsetRecord(path_);
  generation_ = record.generation + record.generation % 2;
  live_start_ = record.live_start;
  return std::nullopt;
}

void RotatingLogFile::WriteOffsetRecord() {
  // Written whole and renamed into place, so a reader never sees half a record. Not fsynced:
  // it only has to agree with the files as other processes see them. A failure is not fatal
  // (the output matters more than its offsets); readers then count from a stale start.
  const std::string record = OffsetRecordPath(path_);
  const std::string temp = record + ".tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string text = fmt::format("{} {}\n", generation_, live_start_);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written || ::rename(temp.c_str(), record.c_str()) != 0) ::unlink(temp.c_str());
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
  ++generation_;  // odd: the files are being renamed
  WriteOffsetRecord();
  std::optional<std::string> error;
  bool live_moved = false;
  if (limits_.keep_files == 0) {
    live_moved = ::unlink(path_.c_str()) == 0 || errno == ENOENT;
  } else {
    // Shift .N-1 -> .N ... .1 -> .2, live -> .1; rename replaces (and so deletes) the oldest.
    for (int32_t index = limits_.keep_files - 1; index >= 1 && !error; --index) {
      std::string from = RotatedPath(path_, index);
      std::string to = RotatedPath(path_, index + 1);
      if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT)
        error = fmt::format("rotate '{}' to '{}': {}", from, to, ErrorText(errno));
    }
    if (!error) {
      std::string first = RotatedPath(path_, 1);
      live_moved = ::rename(path_.c_str(), first.c_str()) == 0 || errno == ENOENT;
      if (!live_moved)
        error = fmt::format("rotate '{}' to '{}': {}", path_, first, ErrorText(errno));
    }
  }
  if (live_moved) {
    live_start_ += size_;  // the next live file starts where this one ended
    size_ = 0;
  }
  if (!error) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) error = fmt::format("reopen log '{}': {}", path_, ErrorText(errno));
  }
  ++generation_;  // even again: the files are in place
  WriteOffsetRecord();
  return error;
}

std::optional<std::string> RotatingLogFile::Write(std::string_view data) {
  if (limits_.max_line_bytes <= 0) return WriteLines(data);
  const auto max = static_cast<size_t>(limits_.max_line_bytes);
  std::string broken;
  broken.reserve(data.size() + data.size() / max + 1);
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const size_t line = newline == std::string_view::npos ? data.size() : newline;
    const size_t room = max - static_cast<size_t>(line_bytes_);
    if (line > room) {
      broken.append(data.substr(0, room));
      broken += '\n';
      data.remove_prefix(room);
      line_bytes_ = 0;
      ++lines_broken_;
      continue;
    }
    if (newline == std::string_view::npos) {
      broken.append(data);
      line_bytes_ += static_cast<int64_t>(data.size());
      break;
    }
    broken.append(data.substr(0, newline + 1));
    data.remove_prefix(newline + 1);
    line_bytes_ = 0;
  }
  return WriteLines(broken);
}

std::optional<std::string> RotatingLogFile::WriteLines(std::string_view data) {
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

namespace {

// One file of a log as stat() saw it, oldest first.
struct LogFilePart {
  std::string path;
  ino_t inode = 0;
  int64_t size = 0;
  int64_t start = 0;  // offset of its first byte
};

}  // namespace

LogRange ReadLogRange(const std::string& path, int32_t keep_files, int64_t offset,
                      int64_t max_bytes) {
  // A rotation takes microseconds; a reader that keeps losing the race gives up after this
  // many tries and answers from what it saw last.
  constexpr int kAttempts = 200;
  LogRange range;
  offset = std::max<int64_t>(offset, 0);
  std::vector<int> open_fds;
  auto close_all = [&] {
    for (int fd : open_fds)
      ::close(fd);
    open_fds.clear();
  };
  for (int attempt = 1;; ++attempt) {
    close_all();
    const bool last_try = attempt >= kAttempts;
    const OffsetRecord record = ReadOffsetRecord(path);
    if (record.generation % 2 == 1 && !last_try) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    // Newest first (live, .1, .2, ...), then reversed.
    std::vector<LogFilePart> parts;
    struct stat info {};
    parts.push_back({path, 0, 0, 0});
    if (::stat(path.c_str(), &info) == 0) parts.back() = {path, info.st_ino, info.st_size, 0};
    for (int32_t index = 1; index <= keep_files; ++index) {
      std::string rotated = RotatingLogFile::RotatedPath(path, index);
      if (::stat(rotated.c_str(), &info) != 0) break;
      parts.push_back({std::move(rotated), info.st_ino, info.st_size, 0});
    }
    std::reverse(parts.begin(), parts.end());
    int64_t rotated_bytes = 0;
    for (size_t index = 0; index + 1 < parts.size(); ++index)
      rotated_bytes += parts[index].size;
    // Without a record (a log never rotated, or written before records existed) the oldest file
    // kept starts at 0.
    int64_t start = std::max<int64_t>(record.live_start - rotated_bytes, 0);
    for (LogFilePart& part : parts) {
      part.start = start;
      start += part.size;
    }
    range.end = start;
    const int64_t oldest = parts.front().start;
    range.skipped = offset < oldest ? oldest - offset : 0;
    range.offset = offset + range.skipped;
    range.data.clear();
    const int64_t want = std::min(std::max<int64_t>(max_bytes, 0), range.end - range.offset);
    if (want <= 0) break;

    // Open the files that hold [offset, offset + want) and check that they are the ones stat()
    // saw; then the record tells whether a rotation ran meanwhile.
    struct Piece {
      int fd;
      int64_t from;  // within the file
      int64_t bytes;
    };
    std::vector<Piece> pieces;
    bool moved = false;
    for (const LogFilePart& part : parts) {
      const int64_t from = std::max(range.offset, part.start);
      const int64_t to = std::min(range.offset + want, part.start + part.size);
      if (from >= to) continue;
      int fd = ::open(part.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::fstat(fd, &info) != 0 || info.st_ino != part.inode) {
        if (fd >= 0) ::close(fd);
        moved = true;
        break;
      }
      open_fds.push_back(fd);
      pieces.push_back({fd, from - part.start, to - from});
    }
    if ((moved || !(ReadOffsetRecord(path) == record)) && !last_try) continue;
    // Rotated files never change and the live one only grows: these bytes are stable.
    range.data.resize(static_cast<size_t>(want));
    int64_t done = 0;
    for (const Piece& piece : pieces) {
      int64_t got_total = 0;
      while (got_total < piece.bytes) {
        ssize_t got = ::pread(piece.fd, range.data.data() + done + got_total,
                              static_cast<size_t>(piece.bytes - got_total),
                              static_cast<off_t>(piece.from + got_total));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        got_total += got;
      }
      done += got_total;
      if (got_total < piece.bytes) break;  // truncated under us: return what is contiguous
    }
    range.data.resize(static_cast<size_t>(done));
    break;
  }
  close_all();
  range.next_offset = range.offset + static_cast<int64_t>(range.data.size());
  return range;
}

}  // namespace gpufleet::agent
