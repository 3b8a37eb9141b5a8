#pragma once

// Holding a fractional GPU share (gpu_milli < 1000) to its part. On NVIDIA GPUs that is CUDA MPS:
// one control daemon per node, started by the agent, and per workload a compute limit
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and a device memory limit on each of its GPUs
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), which the MPS server enforces: a kernel gets at most that
// part of the SMs, an allocation past the limit fails. On simulated GPUs the same limits are
// computed, recorded in the workload's spec and exported, so tests can check them; nothing runs.

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::agent {

enum class GpuSharingMode {
  kAuto,  // kMps on NVML when nvidia-cuda-mps-control is found, else kAdvisory; kRecorded on sim
  kMps,   // enforced by CUDA MPS; the agent refuses to start without the MPS control binary
  kRecorded,  // simulated GPUs: limits computed, recorded and exported, nothing enforces them
  kAdvisory,  // the workload is told its share (GPUFLEET_GPU_*) and trusted to keep to it
};

std::string_view GpuSharingModeName(GpuSharingMode mode);
std::optional<GpuSharingMode> ParseGpuSharingMode(std::string_view name);

// What one workload may use of each GPU it shares.
struct GpuShareLimits {
  int compute_percent = 100;          // of the GPU's SMs, 1..100
  std::vector<MiB> memory_limit_mib;  // per GPU, in the workload's CUDA order (0, 1, ...)
};

// The limits for `share` of GPUs with these memory sizes: compute rounded up to a whole percent
// (a 1/3 share gets 34 %, never 0), memory rounded down to a MiB.
GpuShareLimits ShareLimits(MilliGpu share, const std::vector<MiB>& memory_total_mib);

// "0=27306M,1=27306M": the value of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
std::string PinnedMemoryLimitValue(const std::vector<MiB>& memory_limit_mib);

// The node's MPS control daemon, in a pipe directory of the agent's own (never the default
// /tmp/nvidia-mps, so workloads that are not told of it do not become its clients).
class MpsDaemon {
 public:
  // `root`: DATA_DIR/mps; `control_binary`: nvidia-cuda-mps-control, looked up in PATH when it
  // has no '/'.
  MpsDaemon(std::string root, std::string control_binary);

  const std::string& pipe_directory() const { return pipe_directory_; }
  const std::string& log_directory() const { return log_directory_; }

  // Starts the daemon unless one answers on the pipe directory's control socket (it survives
  // agent restarts, like the workloads it serves); what went wrong, or nothing.
  std::optional<std::string> EnsureRunning();
  // Whether a daemon answers on the control socket now.
  bool Running() const;

  // The control binary's full path, or nothing when it is not to be found.
  static std::optional<std::string> FindControlBinary(const std::string& control_binary);

 private:
  std::string pipe_directory_;
  std::string log_directory_;
  std::string control_binary_;
  std::mutex start_mutex_;  // two launches at once start one daemon
};

}  // namespace gpufleet::agent
