#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/types.h"

namespace gpufleet::agent {

// A MIG instance (a GPU instance with one compute instance) of a GPU in MIG mode: the agent
// schedules it as a device of its own, and the GPU it is cut from is not offered whole.
struct MigInstance {
  int32_t parent_index = 0;  // the NVML index of the GPU it is part of
  std::string parent_uuid;
  uint32_t gpu_instance_id = 0;
  uint32_t compute_instance_id = 0;
  std::string profile;  // "1g.10gb", "3g.40gb": NVIDIA's profile name, from the device's name
};

// What a GPU is: fixed for the life of the agent (GPUs do not appear without a driver reload).
struct GpuInfo {
  int32_t index = 0;         // as NVML and CUDA (with CUDA_DEVICE_ORDER=PCI_BUS_ID) number it
  std::string uuid;          // "GPU-8e3f...": the stable key everywhere else in gpufleet
  std::string product_name;  // as the driver names it: "NVIDIA H100 80GB HBM3"
  std::string model;         // gpufleet's model key that job constraints match: "H100-80GB"
  std::string pci_bus_id;    // "00000000:18:00.0"
  // What a process opens to use it ("/dev/nvidia3", from NVML's minor number; a MIG instance
  // adds its GPU and compute instance's /dev/nvidia-caps/nvidia-capN): hidden from workloads on
  // other GPUs, except those they share. Empty: unknown, or none (simulated).
  std::vector<std::string> device_files;
  std::optional<MigInstance> mig;  // set for a MIG instance: then `uuid` is its "MIG-..." UUID
  MiB memory_total_mib = 0;
  // GPUs with the same id are joined by active NVLinks, directly or through an NVSwitch; a GPU
  // without NVLink is alone on its island. Ids are small and dense, numbered from GPU 0 upwards.
  int32_t nvlink_island = 0;
  std::optional<double> power_limit_w;  // the enforced limit
  bool xid_events_supported = false;    // PollEvents can report XIDs for this GPU
};

// Discover's answer. A GPU the driver lists but cannot describe (no UUID, lost at start) is left
// out of `gpus` and explained in `problems`, so the agent can report the missing capacity.
struct GpuInventory {
  std::vector<GpuInfo> gpus;
  std::vector<std::string> problems;
};

// NVML's clock throttle reason bits (nvmlClocksThrottleReason*), which DCGM also uses.
namespace throttle {
inline constexpr uint64_t kGpuIdle = 0x1;
inline constexpr uint64_t kApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kSwPowerCap = 0x4;
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSyncBoost = 0x10;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kDisplayClockSetting = 0x100;
}  // namespace throttle

struct RemappedRows {
  uint32_t correctable = 0;
  uint32_t uncorrectable = 0;
  bool pending = false;  // a remap is recorded and takes effect at the next GPU reset
  bool failure = false;  // a remap failed: the bank has no spare rows left
};

enum class SampleStatus {
  kOk,          // the fields below hold whatever the driver supports
  kGpuLost,     // the GPU fell off the bus or stopped answering (NVML_ERROR_GPU_IS_LOST)
  kUnknownGpu,  // no GPU with that index
  kFailed,      // the driver failed in another way; see `error`
};

// One reading of one GPU. Every field is optional: empty means the driver or the GPU does not
// support it ("not supported"), and consumers omit it rather than report 0.
struct GpuSample {
  TimeMs time = 0;
  SampleStatus status = SampleStatus::kOk;
  std::string error;  // why status is not kOk

  std::optional<int32_t> utilization_percent;
  std::optional<MiB> memory_used_mib;
  std::optional<MiB> memory_free_mib;
  std::optional<int32_t> temperature_c;
  std::optional<double> power_w;
  std::optional<int32_t> sm_clock_mhz;
  std::optional<int32_t> memory_clock_mhz;
  std::optional<uint64_t> total_energy_mj;  // since the driver loaded
  std::optional<uint64_t> ecc_single_bit_volatile;
  std::optional<uint64_t> ecc_double_bit_volatile;
  std::optional<RemappedRows> remapped_rows;
  std::optional<uint64_t> throttle_reasons;  // bits from `throttle`
  std::optional<std::vector<int32_t>> process_ids;

  // Fields that failed for a reason other than "not supported" (permission, driver error), one
  // line each, so a flaky driver is visible instead of silently missing data.
  std::vector<std::string> warnings;
};

struct XidEvent {
  int32_t gpu_index = 0;
  std::string uuid;
  uint64_t xid = 0;
  TimeMs time = 0;  // when the backend saw it
};

// The seam between the agent and the GPUs: NVML on real machines, a simulation elsewhere. All
// methods are safe to call from several threads (the sampler, the executor, the API).
class GpuBackend {
 public:
  virtual ~GpuBackend() = default;

  // "nvml" or "sim": printed at start and exported as a label, so a simulated node is never
  // mistaken for a real one.
  virtual std::string_view Name() const = 0;
  // The driver version ("550.54.15"), or the simulator's version string.
  virtual std::string DriverVersion() const = 0;

  virtual GpuInventory Discover() = 0;
  // Reads GPU `index` (GpuInfo::index). `now` is the caller's clock: the sample is stamped with
  // it, and the simulator advances its model to it.
  virtual GpuSample Sample(int32_t index, TimeMs now) = 0;
  // XID errors since the previous call; never blocks.
  virtual std::vector<XidEvent> PollEvents(TimeMs now) = 0;
};

}  // namespace gpufleet::agent
