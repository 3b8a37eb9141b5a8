#pragma once

// The node agent's core, without HTTP: the GPU backend (nvml, or sim only when asked for), one
// sampling thread (samples, XID events, health, the cached /metrics text, the simulator's load),
// the workload executor, and which GPUs each workload holds. `gpufleet agent` serves it over HTTP
// (agent_api.h); `gpufleet agent run` uses it in-process. See docs/agent.md.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/cgroups.h"
#include "agent/executor.h"
#include "agent/gpu_backend.h"
#include "agent/gpu_health.h"
#include "agent/gpu_sharing.h"
#include "agent/sim_gpu_backend.h"
#include "agent/workload.h"
#include "core/quantity.h"
#include "core/types.h"

namespace gpufleet::agent {

inline constexpr std::string_view kDefaultAgentDataDir = ".gpufleet/agent";

inline constexpr uint32_t kPerJobUidBase = 200000;
inline constexpr uint32_t kPerJobUids = 65536;

// Whether workloads get a mount namespace of their own (WorkloadIsolation): other GPUs' device
// files hidden, a private /tmp, /var/tmp and /dev/shm. kAuto: when the agent is root.
enum class WorkloadIsolationMode { kAuto, kNamespace, kNone };
std::optional<WorkloadIsolationMode> ParseWorkloadIsolationMode(std::string_view name);

struct AgentOptions {
  std::string data_dir = std::string(kDefaultAgentDataDir);
  // Simulated GPUs: a --sim-gpus spec ("8xH100-80GB", or a profile path ending in .yaml/.yml) or
  // a YAML node profile. Both empty: NVML, and no fallback when it fails.
  std::string sim_gpus;
  std::string sim_profile;
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string hostname;  // empty: this machine's name
  TimeMs sample_interval_ms = 1000;
  bool start_sampler = true;  // false: only SampleNow() samples (the local run path, tests)
  // The shim's argv prefix; empty: {this binary (/proc/self/exe), "agent-shim"}.
  std::vector<std::string> shim_command;
  CgroupMode cgroup_mode = CgroupMode::kAuto;
  // How fractional GPU shares are held to their part (gpu_sharing.h), and the MPS control
  // program for GpuSharingMode::kMps.
  GpuSharingMode gpu_sharing = GpuSharingMode::kAuto;
  std::string mps_control = "nvidia-cuda-mps-control";
  // Whom workloads run as: "agent" (or empty): the agent's own user; "per-job": a uid of their
  // own per job (kPerJobUidBase + job id mod kPerJobUids, gid the same), so jobs cannot read one
  // another's files; "mapped": the node's Unix account named like the job's platform user (a
  // job whose user has none, or whose account is root, does not start); or a user name.
  // Anything but the agent's own user needs a root agent.
  std::string workload_user;
  WorkloadIsolationMode workload_isolation = WorkloadIsolationMode::kAuto;
  GpuHealthConfig health;
  uint64_t sim_seed = 1;
  // Simulated GPUs only: each gets a device file <dir>/nvidia<index> (a character device with
  // /dev/null's numbers; needs root), so device isolation can be seen without GPUs.
  std::string sim_device_dir;
  // Containers (docs/containers.md): the OCI runtime ("auto", "runc", "crun" or a path), the
  // init bound in as PID 1 ("none": none), the image cache (empty dir: <data-dir>/images) and
  // the directory the agent writes its GPUs' CDI spec to (read after /etc/cdi).
  std::string oci_runtime = "auto";
  std::string container_init = "/usr/bin/tini-static";
  std::string image_cache_dir;
  int64_t image_cache_max_bytes = int64_t{20} * 1024 * 1024 * 1024;
  std::string podman = "podman";
  std::string cdi_dir = "/var/run/cdi";
  // How each workload's stdout and stderr are rotated (tests use small files).
  LogLimits workload_logs;
  // Where events (health changes, launches, exits) are reported; default: stderr with a time.
  std::function<void(const std::string&)> log;
};

// Errors carry the kind of failure so the HTTP API can answer 400, 404, 409 or 500.
enum class AgentErrorKind { kBadRequest, kNotFound, kConflict, kInternal };

struct AgentError {
  AgentErrorKind kind = AgentErrorKind::kInternal;
  std::string message;
};

template <typename T>
class AgentResult {
 public:
  AgentResult(T value) : value_(std::move(value)) {}           // NOLINT: implicit by design
  AgentResult(AgentError error) : error_(std::move(error)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const AgentError& error() const { return error_; }

 private:
  std::optional<T> value_;
  AgentError error_;
};

// What a caller asks to run. Exactly one of gpu_count and gpu_indices may be set (neither: no
// GPU).
struct LaunchRequest {
  std::string id;  // empty: the agent makes one ("w-" and 12 hex digits)
  JobId job_id = 0;
  int32_t task_index = 0;
  // Who submitted it on the platform (empty for local launches): the account it runs as under
  // --workload-user mapped.
  std::string platform_user;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string workdir;
  ContainerSpec container;           // an image: run in a container (docs/containers.md)
  std::optional<int32_t> gpu_count;  // the agent picks free healthy GPUs
  std::optional<std::vector<int32_t>> gpu_indices;  // exactly these
  // Of each GPU given by gpu_indices: less than kMilliPerGpu shares them with other workloads
  // whose shares add up to at most one GPU. The workload is told its share and memory limit.
  MilliGpu gpu_milli = kMilliPerGpu;
  MilliCpu cpu_milli = 0;
  MiB memory_mib = 0;
  TimeMs grace_period_ms = kDefaultGracePeriodMs;
  TimeMs max_runtime_ms = 0;
};

struct WorkloadView {
  WorkloadStatus status;
  WorkloadSpec spec;     // as launched (argv, GPUs, limits); empty when spec.json is unreadable
  bool adopted = false;  // found running when this agent started
};

struct GpuView {
  GpuInfo info;
  GpuSample sample;  // the latest
  GpuHealth health;
  std::vector<std::string> workload_ids;  // workloads holding it
  std::vector<std::string> job_ids;       // their jobs, the gpufleet_gpu_job label
};

// A stretch of a workload's output, by byte offsets over everything it wrote.
struct LogChunk {
  std::string data;
  int64_t offset = 0;       // where data starts: the asked offset, or the oldest byte still kept
  int64_t next_offset = 0;  // where to read on from
  int64_t skipped = 0;      // bytes from the asked offset that were rotated away
  bool finished = false;    // the workload ended and this reached its end: nothing more comes
};

inline constexpr int64_t kMaxLogChunkBytes = int64_t{1} << 20;

struct AgentSnapshot {
  std::string hostname;
  std::string backend;
  std::string driver_version;
  std::vector<std::string> problems;  // GPUs the backend could not use
  std::vector<GpuView> gpus;
  TimeMs last_sample_ms = 0;  // wall clock of the latest sampling cycle
};

using gpufleet::ParseCpuMilli;
using gpufleet::ParseDurationMs;
using gpufleet::ParseMemoryMib;
// "SIGTERM" for 15; "signal 99" for numbers it does not know.
std::string SignalName(int32_t signal);
// Where the agent's lines go when no log function is given: stderr, with a UTC timestamp.
void LogToStderr(const std::string& message);

class AgentCore {
 public:
  // Opens the backend (a clear error, never a fallback to simulation, when NVML fails), finds
  // the GPUs, opens the executor over data_dir (re-adopting the workloads recorded there and
  // marking their GPUs in use), samples once, and starts the sampling thread.
  static AgentResult<std::unique_ptr<AgentCore>> Open(AgentOptions options);
  // Stops sampling. Workloads keep running under their shims.
  ~AgentCore();
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  std::string_view backend_name() const;
  // How GPU shares are held on this node, as resolved at Open: never kAuto.
  GpuSharingMode gpu_sharing() const;
  // "the agent's user (root)", "per-job users (uid 200000 + job id)", "user nobody (uid 65534)".
  std::string DescribeWorkloadUser() const;
  // "mount namespace (private /tmp, ...)" or "none (...)": AgentOptions.workload_isolation.
  std::string DescribeWorkloadIsolation() const;
  // "runc 1.1.5, images in /var/lib/gpufleet/images (20 GiB), CDI spec /var/run/cdi/..."; or
  // why containers cannot run here.
  std::string DescribeContainers() const;
  bool mount_namespaces() const;
  std::string driver_version() const;
  const std::string& hostname() const;
  const std::string& data_dir() const;  // absolute
  TimeMs sample_interval_ms() const;
  const GpuInventory& inventory() const;
  bool simulated() const;
  CgroupVersion cgroup_version() const;
  const std::string& cgroup_warning() const;  // why cpu/memory limits cannot be applied
  const std::vector<WorkloadStatus>& adopted() const;
  // Worth saying at start: GPUs left out, missing NVML functions, no cgroup limits, re-adopted
  // workloads.
  const std::vector<std::string>& startup_notes() const;
  // "8 x NVIDIA H100 80GB HBM3 (H100-80GB)", one group per product; "no GPUs" when empty.
  std::string DescribeGpus() const;

  // One sampling cycle now (the thread runs the same at every interval).
  void SampleNow();
  AgentSnapshot Snapshot() const;
  // Prometheus text: the exposition rendered by the last cycle plus the agent's own gauges,
  // which are computed now (so a stuck sampler shows as gpufleet_agent_healthy 0).
  std::string MetricsText() const;
  bool SamplerHealthy() const;  // the last cycle is younger than three intervals

  AgentResult<WorkloadView> Launch(const LaunchRequest& request);
  AgentResult<WorkloadView> Get(const std::string& id) const;
  std::vector<WorkloadView> List() const;
  AgentResult<WorkloadView> Cancel(const std::string& id, std::optional<TimeMs> grace_ms);
  // The last `tail_lines` lines (all when empty) of a workload's stdout or stderr, rotated
  // files included, at most the last 8 MiB.
  AgentResult<std::string> Logs(const std::string& id, std::string_view stream,
                                std::optional<int64_t> tail_lines) const;
  // Up to `max_bytes` of a workload's stdout or stderr from byte `offset`, offsets counting
  // every byte it wrote across log rotation; an offset older than the files kept starts at the
  // oldest kept byte (LogChunk::skipped says how many were lost).
  AgentResult<LogChunk> LogsFrom(const std::string& id, std::string_view stream, int64_t offset,
                                 int64_t max_bytes = kMaxLogChunkBytes) const;
  // Deletes a finished workload's directory (logs included).
  std::optional<AgentError> Forget(const std::string& id);
  // Applies a simulated fault (kConflict unless the backend is sim), samples at once and
  // returns the GPU as it is now.
  AgentResult<GpuView> InjectFault(const SimFault& fault);

  struct State;

 private:
  explicit AgentCore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gpufleet::agent
