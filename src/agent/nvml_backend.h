#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/gpu_backend.h"
#include "core/types.h"

namespace gpufleet::agent {

struct NvmlOptions {
  // What dlopen loads. The default is the driver's library on the loader path; tests point this
  // at a fixture.
  std::string library_path = "libnvidia-ml.so.1";
  // The driver's table of MIG capability device minors ("gpu0/gi1/access 12"): which
  // /dev/nvidia-caps/nvidia-capN opens each MIG instance.
  std::string mig_minors_path = "/proc/driver/nvidia-caps/mig-minors";
};

// Real GPUs through NVML, loaded with dlopen at run time (so the agent builds and starts on
// machines without the driver, and refuses with a clear message rather than failing to link).
// Functions an older driver lacks make their metrics "not supported"; they never crash.
class NvmlBackend final : public GpuBackend {
 public:
  struct LoadResult {
    std::unique_ptr<NvmlBackend> backend;  // set on success
    std::string error;                     // why not, otherwise: say it and refuse to start
  };

  // Loads the library, initialises NVML, enumerates the GPUs once (the set does not change
  // without a driver reload) and registers for XID events.
  static LoadResult Load(const NvmlOptions& options = {});

  ~NvmlBackend() override;
  NvmlBackend(const NvmlBackend&) = delete;
  NvmlBackend& operator=(const NvmlBackend&) = delete;

  std::string_view Name() const override { return "nvml"; }
  std::string DriverVersion() const override;
  GpuInventory Discover() override;
  GpuSample Sample(int32_t index, TimeMs now) override;
  std::vector<XidEvent> PollEvents(TimeMs now) override;

  // Optional NVML functions this driver does not export, for the agent's start-up report.
  std::vector<std::string> MissingFunctions() const;

  struct State;  // NVML's handles and function pointers; defined in nvml_backend.cpp

 private:
  explicit NvmlBackend(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// gpufleet's model key for a GPU the driver names `product_name`: a known model when the name's
// family and the memory size match ("NVIDIA H100 80GB HBM3", 81559 MiB -> "H100-80GB"), else the
// name without its vendor word and with dashes for spaces ("NVIDIA H100 NVL" -> "H100-NVL").
std::string GpuModelKey(std::string_view product_name, MiB memory_total_mib);

}  // namespace gpufleet::agent
