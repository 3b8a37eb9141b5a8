#pragma once

// Size-rotated log files for workload output: stdout.log, then stdout.log.1 (newest rotated) up to
// stdout.log.<keep_files> (oldest); older ones are deleted.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpufleet::agent {

struct LogLimits {
  int64_t rotate_bytes = int64_t{64}
                         << 20;  // a file is rotated before it would exceed this; 0 = never
  int32_t keep_files = 4;        // rotated files kept besides the live one
};

// Returns why the limits are unusable, or nothing.
std::optional<std::string> ValidateLogLimits(const LogLimits& limits);

class RotatingLogFile {
 public:
  RotatingLogFile(std::string path, LogLimits limits);
  ~RotatingLogFile();
  RotatingLogFile(const RotatingLogFile&) = delete;
  RotatingLogFile& operator=(const RotatingLogFile&) = delete;

  // Opens the live file for appending (created if missing); its current size counts toward the
  // rotation limit.
  std::optional<std::string> Open();

  // Appends `data`. Lines are kept whole within one file where a line fits in rotate_bytes;
  // longer lines are split. On a failed write the rest of `data` is counted in bytes_dropped()
  // and the error returned: the caller must keep reading its pipe either way, or the workload
  // would block on a full pipe.
  std::optional<std::string> Write(std::string_view data);

  const std::string& path() const { return path_; }
  int64_t bytes_written() const { return bytes_written_; }
  int64_t bytes_dropped() const { return bytes_dropped_; }

  // "<path>.<index>", index 1 being the newest rotated file.
  static std::string RotatedPath(const std::string& path, int32_t index);

 private:
  std::optional<std::string> Append(std::string_view data);
  std::optional<std::string> Rotate();

  std::string path_;
  LogLimits limits_;
  int fd_ = -1;
  int64_t size_ = 0;  // of the live file
  int64_t bytes_written_ = 0;
  int64_t bytes_dropped_ = 0;
};

}  // namespace gpufleet::agent
