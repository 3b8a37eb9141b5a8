#pragma once

// The workload executor of `gpufleet agent`: runs workloads as real processes confined to their
// GPUs (CUDA_VISIBLE_DEVICES), CPU and memory (cgroups), with rotated logs, cancel with a grace
// period, and survival across agent restarts. Each workload runs under its own detached
// supervisor, the shim (shim.h); all state lives in files under data_dir/workloads/<id>/, so a new
// Executor over the same data dir re-adopts what the previous one started.
// See docs/agent-execution.md.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/cgroups.h"
#include "agent/container_runtime.h"
#include "agent/workload.h"
#include "core/types.h"

namespace gpufleet::agent {

struct ExecutorError {
  std::string message;
};

// A value or a message saying why there is none. Executor methods report every failure this
// way; none throws.
template <typename T>
class ExecutorResult {
 public:
  ExecutorResult(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  ExecutorResult(ExecutorError error) : error_(std::move(error.message)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const std::string& error() const { return error_; }

 private:
  std::optional<T> value_;
  std::string error_;
};

struct ExecutorConfig {
  std::string data_dir;  // created if missing; one Executor at a time (it is locked)
  // The shim's argv prefix; the executor appends --spec <file> --ready-fd 3. The agent passes
  // {<its own binary>, "agent-shim"}; argv[0] is looked up in PATH when it has no '/'.
  std::vector<std::string> shim_command;
  CgroupMode cgroup_mode = CgroupMode::kAuto;
  std::string cgroup_parent = "gpufleet";  // under each hierarchy's root
  std::string cgroup_mountinfo_path = "/proc/self/mountinfo";
  TimeMs launch_timeout = 10 * kMsPerSecond;  // Launch returns "starting" after this long
  // Workloads that name an image run through this (DetectContainerRuntime); without a runtime
  // they fail to start, saying why.
  ContainerRuntimeConfig containers;
};

class Executor {
 public:
  // Creates the data dir, takes its lock, probes cgroups and re-adopts the workloads recorded
  // there (adopted() lists them).
  static ExecutorResult<std::unique_ptr<Executor>> Open(ExecutorConfig config);
  // Workloads keep running: a later Executor over the same data dir adopts them.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  CgroupVersion cgroup_version() const;
  // Why cpu/memory limits cannot be applied on this machine, or empty.
  const std::string& cgroup_warning() const;
  // Every workload found in the data dir at Open, with its state then.
  const std::vector<WorkloadStatus>& adopted() const;

  // Starts the workload and waits (up to launch_timeout) until it exec'ed or failed to:
  // returns its status (running, exited, failed_to_start, or starting on timeout), or an error
  // for an invalid spec or a duplicate id, in which case nothing was started.
  ExecutorResult<WorkloadStatus> Launch(const WorkloadSpec& spec);

  // SIGTERM to the workload's process group, SIGKILL to what is left after the grace period
  // (the spec's unless overridden). Returns at once with the status; cancelling a finished
  // workload changes nothing. A second cancel can only shorten the grace period.
  ExecutorResult<WorkloadStatus> Cancel(const std::string& id,
                                        std::optional<TimeMs> grace_period = std::nullopt);

  ExecutorResult<WorkloadStatus> Get(const std::string& id) const;
  // The spec a workload was launched with (its GPUs, job, limits), as recorded in its directory,
  // so that an agent restarted over the same data dir knows what its adopted workloads hold.
  ExecutorResult<WorkloadSpec> Spec(const std::string& id) const;
  std::vector<WorkloadStatus> List() const;  // sorted by id

  // Deletes a finished (or lost and fully dead) workload's directory, logs included, and its
  // cgroup if still there. Returns why not otherwise.
  std::optional<std::string> Forget(const std::string& id);

 private:
  struct State;
  explicit Executor(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gpufleet::agent
