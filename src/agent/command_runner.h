#pragma once

// Runs a helper program to completion (podman, tar, the OCI runtime's `delete`): what the image
// cache and the shim need of other tools, with a deadline and the tail of what it said.

#include <string>
#include <vector>

#include "core/types.h"

namespace gpufleet::agent {

struct CommandResult {
  bool started = false;  // false: the program could not be run (output says why)
  bool timed_out = false;
  int exit_code = -1;  // -1 when it did not exit normally
  std::string output;  // stdout and stderr together, at most the last 16 KiB
  bool ok() const { return started && !timed_out && exit_code == 0; }
  // "exit code 2: tar: x: Cannot open" — for error messages.
  std::string Describe() const;
};

// argv[0] is looked up in PATH when it has no '/'. The environment is the caller's. A program
// that outlives `timeout_ms` is killed (its process group) and reported as timed out.
CommandResult RunCommand(const std::vector<std::string>& argv, TimeMs timeout_ms);

}  // namespace gpufleet::agent
