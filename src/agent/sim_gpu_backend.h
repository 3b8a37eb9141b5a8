#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "agent/gpu_backend.h"
#include "core/types.h"

namespace gpufleet::agent {

// A GPU model the simulator knows, with the figures nvidia-smi shows for the SXM/PCIe board the
// clusters use. Also used to turn NVML product names into gpufleet model keys.
struct KnownGpuModel {
  std::string_view key;           // gpufleet's model key: "H100-80GB"
  std::string_view family;        // a word of the driver's product name: "H100"
  std::string_view product_name;  // what NVML reports: "NVIDIA H100 80GB HBM3"
  MiB memory_mib = 0;             // usable memory as NVML reports it
  double tdp_w = 0;
  double idle_power_w = 0;
  int32_t nvlink_group = 0;  // GPUs per NVLink island on the usual board; 0 = no NVLink
  int32_t sm_clock_max_mhz = 0;
  int32_t sm_clock_idle_mhz = 0;
  int32_t memory_clock_mhz = 0;
  int32_t slowdown_temperature_c = 0;
  double celsius_per_watt = 0;  // steady-state temperature rise over ambient per watt drawn
};

std::span<const KnownGpuModel> KnownGpuModels();
// Case-insensitive; nullptr when unknown.
const KnownGpuModel* FindKnownGpuModel(std::string_view key);
// "A100-40GB, A100-80GB, ...", for error messages.
std::string KnownGpuModelKeys();

// First-order thermal model: the temperature moves toward ambient + celsius_per_watt * power
// with time constant time_constant_s.
struct SimThermal {
  double ambient_c = 30;
  double celsius_per_watt = 0.06;
  double time_constant_s = 30;
};

// One simulated GPU.
struct SimGpuConfig {
  std::string model;         // gpufleet model key
  std::string product_name;  // reported as the driver's name (the modelName label)
  MiB memory_mib = 0;
  int32_t nvlink_island = 0;
  double tdp_w = 0;
  double power_limit_w = 0;  // at most tdp_w; power is capped here
  double idle_power_w = 0;
  int32_t sm_clock_max_mhz = 0;
  int32_t sm_clock_idle_mhz = 0;
  int32_t memory_clock_mhz = 0;
  int32_t slowdown_temperature_c = 0;
  SimThermal thermal;
};

struct SimNodeProfile {
  std::vector<SimGpuConfig> gpus;
};

// A malformed --sim-gpus spec or node profile; the message says what is wrong and what is known.
class SimSpecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "COUNTxMODEL[@ISLAND]": "8xH100-80GB" is eight H100s on the model's usual NVLink island
// (all eight on one NVSwitch); "8xA100-80GB@4" makes islands of four; "@0" means no NVLink.
SimNodeProfile ParseSimGpuSpec(std::string_view spec);
// A YAML node profile (docs/agent-gpus.md has the format).
SimNodeProfile ParseSimNodeProfileYaml(std::string_view yaml_text);
SimNodeProfile LoadSimNodeProfile(const std::string& path);
// The --sim-gpus argument: a path to a profile when it ends in .yaml or .yml, a spec otherwise.
SimNodeProfile ParseSimGpusArgument(std::string_view argument);

struct SimOptions {
  uint64_t seed = 1;  // drives the utilisation jitter only
  // Mixed into the UUIDs (the agent passes its hostname) so simulated nodes never share UUIDs;
  // the same namespace always gives the same UUIDs.
  std::string uuid_namespace;
  double utilization_jitter_percent = 2;  // reported utilisation = load +- this, while loaded
};

// What runs on a simulated GPU, as the executor reports it.
struct SimGpuLoad {
  double utilization = 0;  // 0..1
  MiB memory_used_mib = 0;
  std::vector<int32_t> process_ids;
};

// Faults the agent API `POST /v1/sim/faults {gpu, kind, code}` injects (docs/agent-gpus.md).
enum class SimFaultKind {
  kXid,          // code = the XID
  kEcc,          // code = double-bit errors to add (at least 1)
  kRowRemap,     // code 1 = remap pending, 2 = remap failure
  kLost,         // the GPU falls off the bus
  kTemperature,  // code = the temperature to report, in C
  kClear,        // a GPU reset: clears all of the above
};
std::optional<SimFaultKind> ParseSimFaultKind(std::string_view name);
const char* Name(SimFaultKind kind);
std::vector<std::string> SimFaultKindNames();

struct SimFault {
  int32_t gpu = 0;
  SimFaultKind kind = SimFaultKind::kXid;
  int64_t code = 0;
};

// Simulated GPUs whose telemetry follows the load the executor reports: utilisation follows the
// load (with a small deterministic jitter), power rises from idle to TDP with it (capped by the
// power limit), the temperature lags behind power, and energy is the integral of power. Time only
// moves when the caller says so (Advance, AdvanceTo, or Sample's `now`), so tests never sleep.
class SimGpuBackend final : public GpuBackend {
 public:
  explicit SimGpuBackend(SimNodeProfile profile, SimOptions options = {});

  std::string_view Name() const override { return "sim"; }
  std::string DriverVersion() const override;
  GpuInventory Discover() override;
  GpuSample Sample(int32_t index, TimeMs now) override;
  std::vector<XidEvent> PollEvents(TimeMs now) override;

  // Moves the model to `now`. The first time seen becomes the start; earlier times are ignored.
  void AdvanceTo(TimeMs now);
  void Advance(TimeMs elapsed);

  // These return why the request is invalid (unknown GPU, load out of range), or nothing. A load
  // applies from the model's current time: advance first when the moment matters.
  std::optional<std::string> SetLoad(int32_t gpu, SimGpuLoad load);
  std::optional<std::string> InjectXid(int32_t gpu, uint64_t xid);
  std::optional<std::string> InjectEcc(int32_t gpu, uint64_t double_bit, uint64_t single_bit = 0);
  std::optional<std::string> InjectRowRemap(int32_t gpu, bool pending, bool failure);
  std::optional<std::string> MarkLost(int32_t gpu);
  std::optional<std::string> SetTemperatureOverride(int32_t gpu, std::optional<int32_t> celsius);
  std::optional<std::string> ClearFaults(int32_t gpu);
  std::optional<std::string> ApplyFault(const SimFault& fault);

 private:
  struct GpuState {
    SimGpuConfig config;
    std::string uuid;
    std::string pci_bus_id;
    SimGpuLoad load;
    double temperature_c = 0;
    double energy_mj = 0;
    uint64_t ecc_single_bit = 0;
    uint64_t ecc_double_bit = 0;
    RemappedRows remapped_rows;
    bool lost = false;
    std::optional<int32_t> temperature_override_c;
  };

  double PowerW(const GpuState& gpu) const;
  void AdvanceLocked(TimeMs now);
  std::optional<std::string> CheckGpu(int32_t gpu) const;
  double NextUnitRandom();

  const SimOptions options_;
  mutable std::mutex mutex_;
  std::vector<GpuState> gpus_;
  std::optional<TimeMs> now_;  // empty until the first time is seen
  uint64_t rng_state_;
  std::vector<XidEvent> pending_events_;
};

}  // namespace gpufleet::agent
