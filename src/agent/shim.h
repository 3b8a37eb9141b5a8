#pragma once

// The per-workload supervisor ("shim", like containerd-shim or conmon). The executor starts it
// detached (setsid + double fork) as `<gpufleet> agent-shim --spec <spec.json> --ready-fd 3`, so
// workloads outlive agent restarts. The shim forks the workload into its own process group and
// cgroup, pumps its stdout/stderr into rotating log files, enforces cancel/timeout grace periods
// and records how it ended in status.json. See docs/agent-execution.md.

#include <string>

namespace gpufleet::agent {

// argv[0] is the command's own name ("agent-shim"); then --spec <path> and optionally
// --ready-fd <fd>. Returns the process exit status: 0 once a final status was recorded
// (including failed_to_start), 1 when even that failed, 2 for bad arguments.
int RunShim(int argc, char** argv);

// ready_fd (or -1): a pipe to the executor, written "running\n" or "failed\n" and closed once the
// workload exec'ed or failed to.
int RunShim(const std::string& spec_path, int ready_fd = -1);

}  // namespace gpufleet::agent
