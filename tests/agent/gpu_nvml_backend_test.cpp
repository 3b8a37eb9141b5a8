// The NVML backend against a missing library, a library that is not NVML, and the test fixture
// gpu_nvml_fake_fixture.cpp (full and minimal builds), loaded by path.
#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/nvml_backend.h"

namespace gpufleet::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The fixture's control functions, reached through our own handle to the same loaded library.
class FakeNvml {
 public:
  explicit FakeNvml(const char* path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) return;
    reset_ = reinterpret_cast<void (*)()>(dlsym(handle_, "gpufleet_fake_nvml_reset"));
    set_init_result_ = reinterpret_cast<void (*)(unsigned int)>(
        dlsym(handle_, "gpufleet_fake_nvml_set_init_result"));
    set_lost_ =
        reinterpret_cast<void (*)(unsigned int)>(dlsym(handle_, "gpufleet_fake_nvml_set_lost"));
    push_xid_ = reinterpret_cast<void (*)(unsigned int, unsigned long long)>(
        dlsym(handle_, "gpufleet_fake_nvml_push_xid"));
    set_mig_gpu_ =
        reinterpret_cast<void (*)(int)>(dlsym(handle_, "gpufleet_fake_nvml_set_mig_gpu"));
    push_mig_xid_ = reinterpret_cast<void (*)(unsigned int, unsigned int, unsigned long long)>(
        dlsym(handle_, "gpufleet_fake_nvml_push_mig_xid"));
  }
  ~FakeNvml() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  FakeNvml(const FakeNvml&) = delete;
  FakeNvml& operator=(const FakeNvml&) = delete;

  bool loaded() const { return handle_ != nullptr && reset_ != nullptr; }
  void Reset() { reset_(); }
  void SetInitResult(unsigned int result) { set_init_result_(result); }
  void SetLost(unsigned int gpu) { set_lost_(gpu); }
  void PushXid(unsigned int gpu, unsigned long long xid) { push_xid_(gpu, xid); }
  void SetMigGpu(int gpu) { set_mig_gpu_(gpu); }
  void PushMigXid(unsigned int gpu, unsigned int gpu_instance, unsigned long long xid) {
    push_mig_xid_(gpu, gpu_instance, xid);
  }

 private:
  void* handle_;
  void (*reset_)() = nullptr;
  void (*set_init_result_)(unsigned int) = nullptr;
  void (*set_lost_)(unsigned int) = nullptr;
  void (*push_xid_)(unsigned int, unsigned long long) = nullptr;
  void (*set_mig_gpu_)(int) = nullptr;
  void (*push_mig_xid_)(unsigned int, unsigned int, unsigned long long) = nullptr;
};

std::unique_ptr<NvmlBackend> LoadOrFail(const char* path) {
  NvmlBackend::LoadResult result = NvmlBackend::Load(NvmlOptions{path});
  EXPECT_EQ(result.error, "");
  return std::move(result.backend);
}

class NvmlBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.loaded()) << dlerror();
    fake_.Reset();
  }
  FakeNvml fake_{GPUFLEET_FAKE_NVML};
};

TEST(NvmlLoadTest, MissingLibraryIsAClearErrorThatPointsAtSimulation) {
  const NvmlBackend::LoadResult result =
      NvmlBackend::Load(NvmlOptions{"/nonexistent/libnvidia-ml.so.1"});
  EXPECT_EQ(result.backend, nullptr);
  EXPECT_THAT(result.error, HasSubstr("cannot load NVML (/nonexistent/libnvidia-ml.so.1)"));
  EXPECT_THAT(result.error, HasSubstr("No such file"));
  EXPECT_THAT(result.error, HasSubstr("--sim-gpus"));
}

TEST(NvmlLoadTest, ALibraryWithoutNvmlIsRefusedNamingWhatItLacks) {
  const NvmlBackend::LoadResult result = NvmlBackend::Load(NvmlOptions{"libm.so.6"});
  EXPECT_EQ(result.backend, nullptr);
  EXPECT_THAT(result.error, HasSubstr("libm.so.6 is not a usable NVML library: it lacks "
                                      "nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2"));
}

TEST_F(NvmlBackendTest, InitFailureIsReportedWithNvmlsOwnMessage) {
  fake_.SetInitResult(9);  // NVML_ERROR_DRIVER_NOT_LOADED
  const NvmlBackend::LoadResult result = NvmlBackend::Load(NvmlOptions{GPUFLEET_FAKE_NVML});
  EXPECT_EQ(result.backend, nullptr);
  EXPECT_THAT(result.error, HasSubstr("nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)"));
}

TEST_F(NvmlBackendTest, DiscoversGpusWithTheirIdentityAndNvlinkIslands) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->Name(), "nvml");
  EXPECT_EQ(backend->DriverVersion(), "550.54.15");

  const GpuInventory inventory = backend->Discover();
  EXPECT_THAT(inventory.problems, ElementsAre());
  ASSERT_EQ(inventory.gpus.size(), 5U);
  const GpuInfo& first = inventory.gpus[0];
  EXPECT_EQ(first.index, 0);
  EXPECT_EQ(first.uuid, "GPU-00000000-1111-2222-3333-000000000000");
  EXPECT_EQ(first.product_name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(first.model, "H100-80GB");
  EXPECT_EQ(first.pci_bus_id, "00000000:18:00.0");
  EXPECT_THAT(first.device_files, ElementsAre("/dev/nvidia1"));  // by minor number, not index
  EXPECT_THAT(inventory.gpus[4].device_files, ElementsAre("/dev/nvidia0"));
  EXPECT_FALSE(first.mig.has_value());
  EXPECT_EQ(first.memory_total_mib, 81559);
  EXPECT_EQ(first.power_limit_w, 700.0);
  EXPECT_TRUE(first.xid_events_supported);
  EXPECT_EQ(inventory.gpus[4].model, "L40S");
  EXPECT_EQ(inventory.gpus[4].memory_total_mib, 46068);

  // 0-1 by a direct link, 2-3 through shared NVSwitches, 4 has no NVLink.
  std::vector<int32_t> islands;
  for (const GpuInfo& gpu : inventory.gpus)
    islands.push_back(gpu.nvlink_island);
  EXPECT_THAT(islands, ElementsAre(0, 0, 1, 1, 2));

  EXPECT_THAT(backend->MissingFunctions(),
              ElementsAre("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetP2PStatus"));
}

TEST_F(NvmlBackendTest, SamplePlumbsEveryFieldWithItsUnit) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  const GpuSample sample = backend->Sample(1, 12'345);
  EXPECT_EQ(sample.status, SampleStatus::kOk);
  EXPECT_EQ(sample.time, 12'345);
  EXPECT_EQ(sample.utilization_percent, 15);
  EXPECT_EQ(sample.memory_used_mib, 2049);  // bytes -> MiB, from the v2 struct
  EXPECT_EQ(sample.memory_free_mib, 81559 - 512 - 2049);
  EXPECT_EQ(sample.temperature_c, 41);
  ASSERT_TRUE(sample.power_w.has_value());
  EXPECT_DOUBLE_EQ(*sample.power_w, 123.457);  // milliwatts -> watts
  EXPECT_EQ(sample.sm_clock_mhz, 1980);
  EXPECT_EQ(sample.memory_clock_mhz, 2619);
  EXPECT_EQ(sample.total_energy_mj, 1'000'000'001U);
  EXPECT_EQ(sample.ecc_single_bit_volatile, 8U);
  EXPECT_EQ(sample.ecc_double_bit_volatile, 0U);
  ASSERT_TRUE(sample.remapped_rows.has_value());
  EXPECT_EQ(sample.remapped_rows->correctable, 1U);
  EXPECT_EQ(sample.remapped_rows->uncorrectable, 2U);
  EXPECT_TRUE(sample.remapped_rows->pending);
  EXPECT_FALSE(sample.remapped_rows->failure);
  EXPECT_EQ(sample.throttle_reasons, throttle::kSwPowerCap);
  EXPECT_EQ(sample.process_ids, std::vector<int32_t>({1000}));
  EXPECT_THAT(sample.warnings, ElementsAre());
}

TEST_F(NvmlBackendTest, ProcessListGrowsPastTheFirstGuess) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  const GpuSample sample = backend->Sample(0, 0);
  ASSERT_TRUE(sample.process_ids.has_value());
  ASSERT_EQ(sample.process_ids->size(), 40U);
  EXPECT_EQ(sample.process_ids->back(), 1039);
}

TEST_F(NvmlBackendTest, UnsupportedFieldsAreEmptyAndOtherFailuresAreWarnings) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  const GpuSample ecc_off = backend->Sample(3, 0);
  EXPECT_EQ(ecc_off.status, SampleStatus::kOk);
  EXPECT_FALSE(ecc_off.ecc_single_bit_volatile.has_value());
  EXPECT_FALSE(ecc_off.ecc_double_bit_volatile.has_value());
  EXPECT_THAT(ecc_off.warnings, ElementsAre());  // "not supported" is not a problem

  const GpuSample no_permission = backend->Sample(4, 0);
  EXPECT_FALSE(no_permission.total_energy_mj.has_value());
  EXPECT_THAT(no_permission.warnings,
              ElementsAre("nvmlDeviceGetTotalEnergyConsumption: Insufficient Permissions "
                          "(NVML error 4)"));
  EXPECT_EQ(no_permission.temperature_c, 44);  // the other fields are still read
}

TEST_F(NvmlBackendTest, LostGpuGivesALostSampleWithoutStaleFields) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  fake_.SetLost(2);
  const GpuSample sample = backend->Sample(2, 99);
  EXPECT_EQ(sample.status, SampleStatus::kGpuLost);
  EXPECT_THAT(sample.error, HasSubstr("GPU is lost (NVML error 15)"));
  EXPECT_EQ(sample.time, 99);
  EXPECT_FALSE(sample.temperature_c.has_value());
  EXPECT_FALSE(sample.utilization_percent.has_value());
  EXPECT_EQ(backend->Sample(1, 99).status, SampleStatus::kOk);  // the others are fine
}

TEST_F(NvmlBackendTest, UnknownIndexIsNotACrash) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->Sample(5, 0).status, SampleStatus::kUnknownGpu);
  EXPECT_EQ(backend->Sample(-1, 0).status, SampleStatus::kUnknownGpu);
}

TEST_F(NvmlBackendTest, XidEventsArriveOnceWithTheGpusUuid) {
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML);
  ASSERT_NE(backend, nullptr);
  EXPECT_THAT(backend->PollEvents(0), ElementsAre());
  fake_.PushXid(2, 79);
  fake_.PushXid(0, 13);
  const std::vector<XidEvent> events = backend->PollEvents(5'000);
  ASSERT_EQ(events.size(), 2U);
  EXPECT_EQ(events[0].gpu_index, 2);
  EXPECT_EQ(events[0].uuid, "GPU-00000000-1111-2222-3333-000000000002");
  EXPECT_EQ(events[0].xid, 79U);
  EXPECT_EQ(events[0].time, 5'000);
  EXPECT_EQ(events[1].gpu_index, 0);
  EXPECT_EQ(events[1].xid, 13U);
  EXPECT_THAT(backend->PollEvents(6'000), ElementsAre());
}

TEST(NvmlMinimalDriverTest, MissingFunctionsMeanNotSupportedNeverACrash) {
  FakeNvml fake(GPUFLEET_FAKE_NVML_MINIMAL);
  ASSERT_TRUE(fake.loaded()) << dlerror();
  fake.Reset();
  const auto backend = LoadOrFail(GPUFLEET_FAKE_NVML_MINIMAL);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->DriverVersion(), "");
  const std::vector<std::string> missing = backend->MissingFunctions();
  for (const char* name : {"nvmlErrorString", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo_v2",
                           "nvmlDeviceGetPowerUsage", "nvmlDeviceGetNvLinkState",
                           "nvmlEventSetCreate", "nvmlEventSetWait_v2"}) {
    EXPECT_NE(std::find(missing.begin(), missing.end(), name), missing.end()) << name;
  }

  const GpuInventory inventory = backend->Discover();
  ASSERT_EQ(inventory.gpus.size(), 5U);
  EXPECT_EQ(inventory.gpus[0].product_name, "");
  EXPECT_EQ(inventory.gpus[0].model, "unknown");
  EXPECT_THAT(inventory.gpus[0].device_files, ElementsAre());  // no minor number: unknown
  EXPECT_EQ(inventory.gpus[0].memory_total_mib, 81559);        // from the v1 memory call
  EXPECT_FALSE(inventory.gpus[0].power_limit_w.has_value());
  EXPECT_FALSE(inventory.gpus[0].xid_events_supported);
  std::vector<int32_t> islands;
  for (const GpuInfo& gpu : inventory.gpus)
    islands.push_back(gpu.nvlink_island);
  EXPECT_THAT(islands, ElementsAre(0, 1, 2, 3, 4));  // no NVLink information: alone

  const GpuSample sample = backend->Sample(2, 0);
  EXPECT_EQ(sample.status, SampleStatus::kOk);
  EXPECT_EQ(sample.temperature_c, 42);
  EXPECT_EQ(sample.memory_used_mib, 1024);
  EXPECT_FALSE(sample.power_w.has_value());
  EXPECT_FALSE(sample.utilization_percent.has_value());
  EXPECT_FALSE(sample.process_ids.has_value());
  EXPECT_THAT(sample.warnings, ElementsAre());
  EXPECT_THAT(backend->PollEvents(0), ElementsAre());
}

// A GPU in MIG mode is offered as its instances, each a device of its own: a MIG UUID, its
// profile in the model key, its own island, and the capability files that open it.
TEST_F(NvmlBackendTest, AGpuInMigModeIsOfferedAsItsInstances) {
  fake_.SetMigGpu(3);
  const std::string minors = ::testing::TempDir() + "/mig-minors";
  {
    std::ofstream file(minors);
    // GPU 3's minor number is 4 in the fixture.
    file << "config 1\nmonitor 2\ngpu4/gi1/access 30\ngpu4/gi1/ci0/access 31\n"
            "gpu4/gi9/access 66\ngpu4/gi9/ci0/access 67\ngpu1/gi1/access 3\n";
  }
  NvmlBackend::LoadResult loaded = NvmlBackend::Load(NvmlOptions{GPUFLEET_FAKE_NVML, minors});
  ASSERT_EQ(loaded.error, "");
  NvmlBackend& backend = *loaded.backend;
  const GpuInventory inventory = backend.Discover();
  EXPECT_THAT(inventory.problems, ElementsAre());
  std::vector<int32_t> indices;
  for (const GpuInfo& gpu : inventory.gpus)
    indices.push_back(gpu.index);
  EXPECT_THAT(indices, ElementsAre(0, 1, 2, 4, 5, 6));  // GPU 3 whole is gone
  const GpuInfo& big = inventory.gpus[4];
  const GpuInfo& small = inventory.gpus[5];
  EXPECT_EQ(big.uuid, "MIG-11111111-2222-3333-4444-000000000000");
  EXPECT_EQ(small.uuid, "MIG-11111111-2222-3333-4444-000000000002");
  EXPECT_EQ(big.model, "H100-80GB-MIG-3g.40gb");
  EXPECT_EQ(small.model, "H100-80GB-MIG-1g.10gb");
  EXPECT_EQ(big.product_name, "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
  EXPECT_EQ(big.memory_total_mib, 40192);
  EXPECT_EQ(small.memory_total_mib, 9856);
  ASSERT_TRUE(big.mig && small.mig);
  EXPECT_EQ(big.mig->parent_index, 3);
  EXPECT_EQ(big.mig->parent_uuid, "GPU-00000000-1111-2222-3333-000000000003");
  EXPECT_EQ(big.mig->gpu_instance_id, 1u);
  EXPECT_EQ(small.mig->gpu_instance_id, 9u);
  EXPECT_EQ(small.mig->profile, "1g.10gb");
  EXPECT_THAT(big.device_files, ElementsAre("/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap30",
                                            "/dev/nvidia-caps/nvidia-cap31"));
  EXPECT_THAT(small.device_files, ElementsAre("/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap66",
                                              "/dev/nvidia-caps/nvidia-cap67"));
  EXPECT_EQ(big.pci_bus_id, "00000000:48:00.0");  // its GPU's
  // GPUs 0-1 and 2 keep their islands; each instance is alone on one.
  EXPECT_EQ(inventory.gpus[2].nvlink_island, 1);
  EXPECT_EQ(big.nvlink_island, 3);
  EXPECT_EQ(small.nvlink_island, 4);

  // Samples are the instance's own (memory); what NVML does not report per instance is absent.
  const GpuSample sample = backend.Sample(5, 0);
  EXPECT_EQ(sample.status, SampleStatus::kOk);
  EXPECT_EQ(sample.memory_used_mib, 13);
  EXPECT_FALSE(sample.utilization_percent.has_value());
  EXPECT_THAT(sample.warnings, ElementsAre());
  EXPECT_EQ(backend.Sample(3, 0).status, SampleStatus::kUnknownGpu);

  // An XID of GPU instance 9 is its instance's; one of the whole GPU is both instances'.
  fake_.PushMigXid(3, 9, 31);
  fake_.PushXid(3, 79);
  std::vector<std::pair<int32_t, uint64_t>> events;
  for (const XidEvent& event : backend.PollEvents(0))
    events.emplace_back(event.gpu_index, event.xid);
  EXPECT_THAT(events,
              ElementsAre(std::pair<int32_t, uint64_t>{6, 31}, std::pair<int32_t, uint64_t>{5, 79},
                          std::pair<int32_t, uint64_t>{6, 79}));
}

TEST_F(NvmlBackendTest, MigInstancesWithoutCapabilityMinorsAreNamedAsNotFencedOff) {
  fake_.SetMigGpu(0);
  NvmlBackend::LoadResult loaded =
      NvmlBackend::Load(NvmlOptions{GPUFLEET_FAKE_NVML, "/nonexistent/mig-minors"});
  ASSERT_EQ(loaded.error, "");
  const GpuInventory inventory = loaded.backend->Discover();
  ASSERT_EQ(inventory.gpus.size(), 6u);
  EXPECT_THAT(inventory.gpus[4].device_files, ElementsAre("/dev/nvidia1"));
  ASSERT_EQ(inventory.problems.size(), 2u);
  EXPECT_THAT(inventory.problems[0],
              HasSubstr("GPU 0 MIG 3g.40gb (GPU instance 1): no capability minors for it in "
                        "/nonexistent/mig-minors"));
  // GPU 1 was joined to GPU 0 by NVLink; alone now.
  EXPECT_EQ(inventory.gpus[0].index, 1);
  EXPECT_NE(inventory.gpus[0].nvlink_island, inventory.gpus[1].nvlink_island);
}

TEST(GpuModelKeyTest, KnownProductNamesMapToModelKeys) {
  EXPECT_EQ(GpuModelKey("NVIDIA H100 80GB HBM3", 81559), "H100-80GB");
  EXPECT_EQ(GpuModelKey("NVIDIA A100-SXM4-80GB", 81920), "A100-80GB");
  EXPECT_EQ(GpuModelKey("NVIDIA A100-PCIE-40GB", 40536), "A100-40GB");
  EXPECT_EQ(GpuModelKey("NVIDIA H200", 143771), "H200-141GB");
  EXPECT_EQ(GpuModelKey("Tesla T4", 15360), "T4");
  EXPECT_EQ(GpuModelKey("Tesla V100-SXM2-32GB", 32768), "V100-32GB");
  // Unknown boards keep a readable key instead of being forced into a known one.
  EXPECT_EQ(GpuModelKey("NVIDIA H100 NVL", 95830), "H100-NVL");
  EXPECT_EQ(GpuModelKey("Tesla V100-SXM2-16GB", 16384), "V100-SXM2-16GB");
  EXPECT_EQ(GpuModelKey("NVIDIA L40", 46068), "L40");
}

}  // namespace
}  // namespace gpufleet::agent
