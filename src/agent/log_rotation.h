#pragma once

// Size-rotated log files for workload output: stdout.log, then stdout.log.1 (newest rotated) up to
// stdout.log.<keep_files> (oldest); older ones are deleted. Output is addressed by offsets that
// count every byte ever written, across rotations: the writer keeps a small record
// (stdout.log.offset) of where the live file starts, so a reader can tell which files hold an
// offset and how many bytes were deleted (ReadLogRange).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpufleet::agent {

struct LogLimits {
  int64_t rotate_bytes = int64_t{64}
                         << 20;  // a file is rotated before it would exceed this; 0 = never
  int32_t keep_files = 4;        // rotated files kept besides the live one
  // A longer line is broken with a newline after this many bytes (as journald and Docker do), so
  // whoever reads the last lines holds at most this much per line; 0 = never.
  int64_t max_line_bytes = int64_t{64} << 10;
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

  // Appends `data`, breaking lines longer than max_line_bytes. Lines are kept whole within one
  // file where a line fits in rotate_bytes; longer lines are split. On a failed write the rest of
  // `data` is counted in bytes_dropped() and the error returned: the caller must keep reading its
  // pipe either way, or the workload would block on a full pipe.
  std::optional<std::string> Write(std::string_view data);

  const std::string& path() const { return path_; }
  int64_t bytes_written() const { return bytes_written_; }
  int64_t bytes_dropped() const { return bytes_dropped_; }
  int64_t lines_broken() const { return lines_broken_; }  // newlines added by max_line_bytes

  // "<path>.<index>", index 1 being the newest rotated file.
  static std::string RotatedPath(const std::string& path, int32_t index);
  // "<path>.offset": "<generation> <offset of the live file's first byte>". Absent until the
  // first rotation (the live file starts at 0). The generation is odd while a rotation renames
  // files, so a reader that sees the same even generation before and after opening the files
  // knows it saw one consistent set.
  static std::string OffsetRecordPath(const std::string& path);

 private:
  std::optional<std::string> WriteLines(std::string_view data);
  std::optional<std::string> Append(std::string_view data);
  std::optional<std::string> Rotate();
  void WriteOffsetRecord();

  std::string path_;
  LogLimits limits_;
  int fd_ = -1;
  int64_t size_ = 0;  // of the live file
  int64_t bytes_written_ = 0;
  int64_t bytes_dropped_ = 0;
  int64_t line_bytes_ = 0;  // of the line being written, since its last newline
  int64_t lines_broken_ = 0;
  uint64_t generation_ = 0;  // of the offset record
  int64_t live_start_ = 0;   // offset of the live file's first byte
};

// A stretch of a rotated log, by offsets over everything written to it.
struct LogRange {
  std::string data;
  int64_t offset = 0;       // where `data` starts (the asked offset, or the oldest kept byte)
  int64_t next_offset = 0;  // offset + data.size(): where to read on from
  int64_t skipped = 0;      // bytes between the asked offset and `offset` that were rotated away
  int64_t end = 0;          // everything written so far
};

// Reads up to `max_bytes` from `offset` of the log whose live file is `path`, rotated files
// <path>.1 ... <path>.<keep_files> included; safe while the shim writes and rotates it. An offset
// past the end gives no data and next_offset == offset. A missing log reads as empty.
LogRange ReadLogRange(const std::string& path, int32_t keep_files, int64_t offset,
                      int64_t max_bytes);

}  // namespace gpufleet::agent
