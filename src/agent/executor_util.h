#pragma once

// Small POSIX helpers shared by the executor and the shim.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "core/types.h"

namespace gpufleet::agent::executor_internal {

struct ProcStat {
  char state = '?';  // 'R', 'S', 'Z' (zombie), ...
  int32_t ppid = 0;
  int32_t pgrp = 0;
  uint64_t start_ticks = 0;  // start time, clock ticks since boot: tells a reused pid apart
};

// Parses /proc/<pid>/stat; nothing when there is no such process.
std::optional<ProcStat> ReadProcStat(pid_t pid);

// The process exists, is not a zombie, and started at `start_ticks`.
bool IsLiveProcess(pid_t pid, uint64_t start_ticks);

// Live (non-zombie) members of the process group whose leader was `pgid` started at
// `leader_start_ticks`. Empty when the group is gone, or when its number now belongs to a new
// leader (a pid stays reserved while any member of its group lives, so members found while the
// leader's pid is free are ours).
std::vector<pid_t> LiveGroupMembers(pid_t pgid, uint64_t leader_start_ticks);

std::string ErrnoText(int err);
TimeMs WallClockMs();
TimeMs MonotonicMs();

// Whole file, or nothing (errno set) when it cannot be read.
std::optional<std::string> ReadFileToString(const std::string& path);
// Writes <path>.tmp, fsyncs and renames it over `path`, so readers see the old or the new file.
std::optional<std::string> WriteFileAtomically(const std::string& path, std::string_view content);
// Writes `value` to a kernel file (cgroupfs) in one write().
std::optional<std::string> WriteKernelFile(const std::string& path, std::string_view value);

// Async-signal-safe (between fork and exec): writes `value` in decimal at `out`, which has room
// for 10 digits, and returns how many it wrote. No terminating NUL.
size_t FormatDecimal(unsigned value, char* out);

// What execvp would run for `command` given the workload's PATH, with relative paths taken from
// `workdir`: the command itself when it contains '/', else the first executable regular file in
// PATH. Nothing and `err` (ENOENT or EACCES, as execvp reports them) when there is none.
std::optional<std::string> ResolveCommand(const std::string& command, const std::string& path_env,
                                          const std::string& workdir, int& err);

}  // namespace gpufleet::agent::executor_internal
