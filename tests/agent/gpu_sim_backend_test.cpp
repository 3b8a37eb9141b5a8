// Simulated GPUs: --sim-gpus specs and node profiles, telemetry that follows the load (power,
// thermal lag, energy), and fault injection. Time only moves when a test says so.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/sim_gpu_backend.h"
#include "sim_gpu_test_util.h"

namespace gpufleet::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string SpecError(std::string_view spec) {
  try {
    ParseSimGpuSpec(spec);
  } catch (const SimSpecError& error) {
    return error.what();
  }
  return "";
}

std::string ProfileError(std::string_view yaml) {
  try {
    ParseSimNodeProfileYaml(yaml);
  } catch (const SimSpecError& error) {
    return error.what();
  }
  return "";
}

std::vector<int32_t> Islands(const SimNodeProfile& profile) {
  std::vector<int32_t> islands;
  for (const SimGpuConfig& gpu : profile.gpus)
    islands.push_back(gpu.nvlink_island);
  return islands;
}

SimGpuBackend OneH100() {
  return SimGpuBackend(ParseSimGpuSpec("1xH100-80GB"));
}

// --- specs and profiles -------------------------------------------------------------------------

TEST(SimSpecTest, CountTimesModel) {
  const SimNodeProfile profile = ParseSimGpuSpec("8xH100-80GB");
  ASSERT_EQ(profile.gpus.size(), 8U);
  for (const SimGpuConfig& gpu : profile.gpus) {
    EXPECT_EQ(gpu.model, "H100-80GB");
    EXPECT_EQ(gpu.product_name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(gpu.memory_mib, 81559);
    EXPECT_EQ(gpu.tdp_w, 700);
    EXPECT_EQ(gpu.power_limit_w, 700);
    EXPECT_EQ(gpu.idle_power_w, 70);
  }
  // All eight on one NVSwitch island.
  EXPECT_THAT(Islands(profile), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(SimSpecTest, IslandsFollowTheModelOrTheOverride) {
  EXPECT_THAT(Islands(ParseSimGpuSpec("8xA100-80GB@4")), ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  EXPECT_THAT(Islands(ParseSimGpuSpec("4xL40S")), ElementsAre(0, 1, 2, 3));  // PCIe only
  EXPECT_THAT(Islands(ParseSimGpuSpec("3xH200-141GB@0")), ElementsAre(0, 1, 2));
  EXPECT_THAT(Islands(ParseSimGpuSpec("4xT4")), ElementsAre(0, 1, 2, 3));
}

TEST(SimSpecTest, ModelNamesAreCaseInsensitiveButCanonical) {
  const SimNodeProfile profile = ParseSimGpuSpec("2xh100-80gb");
  ASSERT_EQ(profile.gpus.size(), 2U);
  EXPECT_EQ(profile.gpus[0].model, "H100-80GB");
}

TEST(SimSpecTest, EveryRequiredModelIsKnown) {
  for (const char* model :
       {"H100-80GB", "H200-141GB", "A100-80GB", "A100-40GB", "L40S", "V100-32GB", "T4"}) {
    const KnownGpuModel* known = FindKnownGpuModel(model);
    ASSERT_NE(known, nullptr) << model;
    EXPECT_GT(known->memory_mib, 0) << model;
    EXPECT_GT(known->tdp_w, known->idle_power_w) << model;
    EXPECT_GT(known->idle_power_w, 0) << model;
  }
}

TEST(SimSpecTest, BadSpecsSayWhatIsWrongAndListTheKnownModels) {
  const std::string known = "A100-40GB, A100-80GB, H100-80GB, H200-141GB, L40S, T4, V100-32GB";
  EXPECT_EQ(SpecError("0xH100"), "--sim-gpus '0xH100': the GPU count must be 1 to 64");
  EXPECT_EQ(SpecError("65xH100-80GB"), "--sim-gpus '65xH100-80GB': the GPU count must be 1 to 64");
  EXPECT_EQ(SpecError("8xNOPE"),
            "--sim-gpus '8xNOPE': unknown GPU model 'NOPE'; known models: " + known);
  EXPECT_EQ(SpecError("H100"),
            "--sim-gpus 'H100': expected COUNTxMODEL, e.g. 8xH100-80GB; known models: " + known);
  EXPECT_EQ(SpecError(""),
            "--sim-gpus '': expected COUNTxMODEL, e.g. 8xH100-80GB; known models: " + known);
  EXPECT_EQ(SpecError("eightxH100-80GB"),
            "--sim-gpus 'eightxH100-80GB': 'eight' is not a GPU count");
  EXPECT_EQ(SpecError("8xH100-80GB@9"),
            "--sim-gpus '8xH100-80GB@9': '@9' must be the GPUs per NVLink island, 0 to 8");
  EXPECT_EQ(SpecError("8xH100-80GB@"),
            "--sim-gpus '8xH100-80GB@': '@' must be the GPUs per NVLink island, 0 to 8");
}

TEST(SimProfileTest, YamlProfileWithDefaultsOverridesAndACustomModel) {
  const SimNodeProfile profile = ParseSimNodeProfileYaml(R"(
thermal: {ambient_c: 25, time_constant_s: 40}
gpus:
  - model: H100-80GB
    count: 4
    power_limit_w: 500
  - model: A100-40GB
    count: 2
    nvlink_island: 7
    thermal: {celsius_per_watt: 0.2}
  - model: MI300X
    product_name: AMD Instinct MI300X
    memory_mib: 196608
    tdp_w: 750
    idle_power_w: 90
)");
  ASSERT_EQ(profile.gpus.size(), 7U);
  EXPECT_THAT(Islands(profile), ElementsAre(0, 0, 0, 0, 7, 7, 8));
  const SimGpuConfig& h100 = profile.gpus[0];
  EXPECT_EQ(h100.power_limit_w, 500);
  EXPECT_EQ(h100.tdp_w, 700);
  EXPECT_EQ(h100.thermal.ambient_c, 25);
  EXPECT_EQ(h100.thermal.time_constant_s, 40);
  EXPECT_EQ(h100.thermal.celsius_per_watt, 0.06);  // the model's
  EXPECT_EQ(profile.gpus[4].thermal.celsius_per_watt, 0.2);
  EXPECT_EQ(profile.gpus[4].memory_mib, 40960);
  const SimGpuConfig& custom = profile.gpus[6];
  EXPECT_EQ(custom.model, "MI300X");
  EXPECT_EQ(custom.product_name, "AMD Instinct MI300X");
  EXPECT_EQ(custom.memory_mib, 196608);
  EXPECT_EQ(custom.power_limit_w, 750);
}

TEST(SimProfileTest, ProfileErrorsNameThePlace) {
  EXPECT_THAT(ProfileError("gpus: []"), HasSubstr("'gpus' is empty"));
  EXPECT_THAT(ProfileError("gpu: []"), HasSubstr("expected a map with a 'gpus' list"));
  EXPECT_THAT(ProfileError("gpus:\n  - model: H100-80GB\n    cuont: 2\n"),
              HasSubstr("gpus[0]: unknown key 'cuont'"));
  EXPECT_THAT(ProfileError("gpus:\n  - model: NOPE\n"),
              HasSubstr("gpus[0]: unknown GPU model 'NOPE' needs memory_mib, tdp_w and "
                        "idle_power_w (missing memory_mib); known models: A100-40GB"));
  EXPECT_THAT(ProfileError("gpus:\n  - model: T4\n  - model: T4\n    count: many\n"),
              HasSubstr("gpus[1]: count: expected a whole number but got 'many'"));
  EXPECT_THAT(ProfileError("gpus:\n  - model: T4\n    power_limit_w: 90\n"),
              HasSubstr("gpus[0]: power_limit_w must be between idle_power_w and tdp_w"));
  EXPECT_THAT(ProfileError("gpus: [unclosed"), HasSubstr("node profile:"));
}

TEST(SimProfileTest, ArgumentIsASpecOrAProfilePath) {
  EXPECT_EQ(ParseSimGpusArgument("2xT4").gpus.size(), 2U);
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "sim_node_profile.yaml").string();
  std::ofstream(path) << "gpus:\n  - model: H200-141GB\n    count: 8\n";
  const SimNodeProfile from_file = ParseSimGpusArgument(path);
  EXPECT_EQ(from_file.gpus.size(), 8U);
  try {
    ParseSimGpusArgument("/nonexistent/profile.yaml");
    FAIL() << "no error for a missing profile";
  } catch (const SimSpecError& error) {
    EXPECT_THAT(error.what(), HasSubstr("cannot read node profile '/nonexistent/profile.yaml'"));
  }
}

// --- inventory ----------------------------------------------------------------------------------

TEST(SimBackendTest, DiscoverDescribesEveryGpu) {
  SimGpuBackend backend(ParseSimGpuSpec("8xH100-80GB"), Options("node-a"));
  EXPECT_EQ(backend.Name(), "sim");
  EXPECT_THAT(backend.DriverVersion(), HasSubstr("sim-"));
  const GpuInventory inventory = backend.Discover();
  EXPECT_THAT(inventory.problems, ElementsAre());
  ASSERT_EQ(inventory.gpus.size(), 8U);
  for (int32_t i = 0; i < 8; ++i) {
    const GpuInfo& gpu = inventory.gpus[static_cast<size_t>(i)];
    EXPECT_EQ(gpu.index, i);
    EXPECT_EQ(gpu.model, "H100-80GB");
    EXPECT_EQ(gpu.product_name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(gpu.memory_total_mib, 81559);
    EXPECT_EQ(gpu.power_limit_w, 700.0);
    EXPECT_TRUE(gpu.xid_events_supported);
    EXPECT_THAT(gpu.uuid, ::testing::MatchesRegex(
                              "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"));
    for (int32_t j = 0; j < i; ++j) {
      EXPECT_NE(gpu.uuid, inventory.gpus[static_cast<size_t>(j)].uuid);
      EXPECT_NE(gpu.pci_bus_id, inventory.gpus[static_cast<size_t>(j)].pci_bus_id);
    }
  }
  EXPECT_EQ(inventory.gpus[0].pci_bus_id, "00000000:18:00.0");
}

TEST(SimBackendTest, UuidsAreStablePerNamespaceAndDistinctAcrossNodes) {
  const auto uuid = [](std::string name) {
    SimGpuBackend backend(ParseSimGpuSpec("1xT4"), Options(std::move(name)));
    return backend.Discover().gpus[0].uuid;
  };
  EXPECT_EQ(uuid("node-a"), uuid("node-a"));
  EXPECT_NE(uuid("node-a"), uuid("node-b"));
}

// --- telemetry ----------------------------------------------------------------------------------

TEST(SimTelemetryTest, PowerGoesFromIdleToTdpWithUtilisation) {
  SimGpuBackend backend = OneH100();
  EXPECT_EQ(backend.Sample(0, 0).power_w, 70.0);
  ASSERT_EQ(backend.SetLoad(0, Load(1.0)), std::nullopt);
  EXPECT_EQ(backend.Sample(0, 0).power_w, 700.0);
  ASSERT_EQ(backend.SetLoad(0, Load(0.5)), std::nullopt);
  EXPECT_EQ(backend.Sample(0, 0).power_w, 385.0);
}

TEST(SimTelemetryTest, PowerLimitCapsPowerAndSetsTheThrottleReason) {
  SimNodeProfile profile = ParseSimGpuSpec("1xH100-80GB");
  profile.gpus[0].power_limit_w = 500;
  SimGpuBackend backend(std::move(profile));
  ASSERT_EQ(backend.SetLoad(0, Load(0.5)), std::nullopt);
  GpuSample sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.power_w, 385.0);
  EXPECT_EQ(*sample.throttle_reasons & throttle::kSwPowerCap, 0U);
  ASSERT_EQ(backend.SetLoad(0, Load(1.0)), std::nullopt);
  sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.power_w, 500.0);
  EXPECT_EQ(sample.throttle_reasons, throttle::kSwPowerCap);
}

TEST(SimTelemetryTest, IdleGpuReportsIdle) {
  SimGpuBackend backend = OneH100();
  const GpuSample sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.status, SampleStatus::kOk);
  EXPECT_EQ(sample.utilization_percent, 0);
  EXPECT_EQ(sample.memory_used_mib, 0);
  EXPECT_EQ(sample.memory_free_mib, 81559);
  EXPECT_EQ(sample.temperature_c, 34);  // 30 C ambient + 0.06 C/W * 70 W, rounded
  EXPECT_EQ(sample.sm_clock_mhz, 345);
  EXPECT_EQ(sample.memory_clock_mhz, 2619);
  EXPECT_EQ(sample.throttle_reasons, throttle::kGpuIdle);
  EXPECT_EQ(sample.ecc_double_bit_volatile, 0U);
  EXPECT_EQ(sample.process_ids, std::vector<int32_t>{});
}

TEST(SimTelemetryTest, TemperatureRisesWithLagThenSettles) {
  SimGpuBackend backend = OneH100();
  backend.AdvanceTo(0);
  ASSERT_EQ(backend.SetLoad(0, Load(1.0)), std::nullopt);
  // Target 30 + 0.06 * 700 = 72 C from 34.2 C with a 30 s time constant.
  const auto expected_at = [](double seconds) {
    return 72.0 + (34.2 - 72.0) * std::exp(-seconds / 30.0);
  };
  int32_t previous = backend.Sample(0, 0).temperature_c.value();
  EXPECT_EQ(previous, 34);
  EXPECT_LE(backend.Sample(0, 1 * kSecond).temperature_c.value(), 36);  // no jump: lag
  for (int seconds = 5; seconds <= 300; seconds += 5) {
    const int32_t now = backend.Sample(0, seconds * kSecond).temperature_c.value();
    EXPECT_GE(now, previous) << seconds;
    EXPECT_EQ(now, std::lround(expected_at(seconds))) << seconds;
    previous = now;
  }
  EXPECT_EQ(backend.Sample(0, 30 * kSecond).temperature_c, 72);  // earlier times are ignored
  EXPECT_EQ(previous, 72);
  // Cools back down the same way.
  ASSERT_EQ(backend.SetLoad(0, Load(0)), std::nullopt);
  EXPECT_EQ(backend.Sample(0, 600 * kSecond).temperature_c, 34);
}

TEST(SimTelemetryTest, TheModelIsExactWhateverTheStep) {
  SimGpuBackend coarse = OneH100();
  SimGpuBackend fine = OneH100();
  for (SimGpuBackend* backend : {&coarse, &fine}) {
    backend->AdvanceTo(0);
    ASSERT_EQ(backend->SetLoad(0, Load(0.8)), std::nullopt);
  }
  coarse.Advance(45 * kSecond);
  for (int i = 0; i < 450; ++i)
    fine.Advance(100);
  const GpuSample a = coarse.Sample(0, 45 * kSecond);
  const GpuSample b = fine.Sample(0, 45 * kSecond);
  EXPECT_EQ(a.temperature_c, b.temperature_c);
  EXPECT_NEAR(static_cast<double>(*a.total_energy_mj), static_cast<double>(*b.total_energy_mj), 1);
}

TEST(SimTelemetryTest, EnergyIsTheIntegralOfPower) {
  SimGpuBackend backend = OneH100();
  backend.AdvanceTo(1'700'000'000'000);  // the first time seen is the start, whatever the clock
  EXPECT_EQ(backend.Sample(0, 1'700'000'000'000).total_energy_mj, 0U);
  backend.Advance(10 * kSecond);  // idle: 70 W * 10 s = 700 J
  EXPECT_EQ(backend.Sample(0, 1'700'000'010'000).total_energy_mj, 700'000U);
  ASSERT_EQ(backend.SetLoad(0, Load(1.0)), std::nullopt);
  backend.Advance(5 * kSecond);  // 700 W * 5 s = 3500 J
  EXPECT_EQ(backend.Sample(0, 1'700'000'015'000).total_energy_mj, 4'200'000U);
}

TEST(SimTelemetryTest, UtilisationFollowsLoadWithSmallDeterministicJitter) {
  SimGpuBackend first = OneH100();
  SimGpuBackend second = OneH100();
  SimGpuBackend other_seed(ParseSimGpuSpec("1xH100-80GB"), Options("", 99));
  std::vector<int32_t> a;
  std::vector<int32_t> b;
  std::vector<int32_t> c;
  for (SimGpuBackend* backend : {&first, &second, &other_seed}) {
    ASSERT_EQ(backend->SetLoad(0, Load(0.5)), std::nullopt);
  }
  for (int i = 0; i < 50; ++i) {
    a.push_back(first.Sample(0, i * kSecond).utilization_percent.value());
    b.push_back(second.Sample(0, i * kSecond).utilization_percent.value());
    c.push_back(other_seed.Sample(0, i * kSecond).utilization_percent.value());
  }
  EXPECT_EQ(a, b);  // same seed, same readings
  EXPECT_NE(a, c);
  for (int32_t value : a) {
    EXPECT_GE(value, 48);
    EXPECT_LE(value, 52);
  }
  EXPECT_NE(*std::min_element(a.begin(), a.end()), *std::max_element(a.begin(), a.end()));

  ASSERT_EQ(first.SetLoad(0, Load(1.0)), std::nullopt);
  for (int i = 0; i < 20; ++i)
    EXPECT_GE(first.Sample(0, 0).utilization_percent.value(), 98);
}

TEST(SimTelemetryTest, MemoryAndProcessesFollowTheLoad) {
  SimGpuBackend backend = OneH100();
  ASSERT_EQ(backend.SetLoad(0, Load(0.3, 40'000, {4242, 4243})), std::nullopt);
  GpuSample sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.memory_used_mib, 40'000);
  EXPECT_EQ(sample.memory_free_mib, 41'559);
  EXPECT_EQ(sample.process_ids, std::vector<int32_t>({4242, 4243}));
  EXPECT_EQ(sample.sm_clock_mhz, 1980);
  EXPECT_EQ(sample.throttle_reasons, 0U);
  ASSERT_EQ(backend.SetLoad(0, Load(0.3, 1'000'000)), std::nullopt);
  sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.memory_used_mib, 81559);  // cannot use more than there is
  EXPECT_EQ(sample.memory_free_mib, 0);
}

TEST(SimTelemetryTest, InvalidRequestsAreRefusedWithAReason) {
  SimGpuBackend backend(ParseSimGpuSpec("2xT4"));
  EXPECT_EQ(backend.SetLoad(2, Load(0)), "no simulated GPU 2 (this node has GPUs 0 to 1)");
  EXPECT_EQ(backend.SetLoad(0, Load(1.5)), "utilization 1.5 is outside 0..1");
  EXPECT_EQ(backend.SetLoad(0, Load(std::nan(""))), "utilization nan is outside 0..1");
  EXPECT_EQ(backend.SetLoad(0, Load(0, -1)), "memory_used_mib must not be negative");
  EXPECT_EQ(backend.InjectXid(-1, 79), "no simulated GPU -1 (this node has GPUs 0 to 1)");
  EXPECT_EQ(backend.Sample(7, 0).status, SampleStatus::kUnknownGpu);
}

// --- faults -------------------------------------------------------------------------------------

TEST(SimFaultTest, XidIsDeliveredOnceWithTheSimulatedTime) {
  SimGpuBackend backend(ParseSimGpuSpec("2xH100-80GB"));
  backend.AdvanceTo(5 * kSecond);
  ASSERT_EQ(backend.InjectXid(1, 79), std::nullopt);
  const std::vector<XidEvent> events = backend.PollEvents(6 * kSecond);
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].gpu_index, 1);
  EXPECT_EQ(events[0].uuid, backend.Discover().gpus[1].uuid);
  EXPECT_EQ(events[0].xid, 79U);
  EXPECT_EQ(events[0].time, 5 * kSecond);
  EXPECT_THAT(backend.PollEvents(7 * kSecond), ElementsAre());
}

TEST(SimFaultTest, EccRowRemapLostAndTemperatureShowInSamplesUntilCleared) {
  SimGpuBackend backend(ParseSimGpuSpec("2xH100-80GB"));
  ASSERT_EQ(backend.InjectEcc(0, 2, 5), std::nullopt);
  ASSERT_EQ(backend.InjectRowRemap(0, true, false), std::nullopt);
  ASSERT_EQ(backend.SetTemperatureOverride(0, 95), std::nullopt);
  GpuSample sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.ecc_double_bit_volatile, 2U);
  EXPECT_EQ(sample.ecc_single_bit_volatile, 5U);
  EXPECT_TRUE(sample.remapped_rows->pending);
  EXPECT_EQ(sample.remapped_rows->uncorrectable, 1U);
  EXPECT_EQ(sample.temperature_c, 95);
  EXPECT_EQ(*sample.throttle_reasons & throttle::kSwThermalSlowdown, throttle::kSwThermalSlowdown);

  ASSERT_EQ(backend.MarkLost(0), std::nullopt);
  sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.status, SampleStatus::kGpuLost);
  EXPECT_THAT(sample.error, HasSubstr("fallen off the bus"));
  EXPECT_FALSE(sample.temperature_c.has_value());
  EXPECT_EQ(backend.Sample(1, 0).status, SampleStatus::kOk);  // only GPU 0

  ASSERT_EQ(backend.ClearFaults(0), std::nullopt);
  sample = backend.Sample(0, 0);
  EXPECT_EQ(sample.status, SampleStatus::kOk);
  EXPECT_EQ(sample.ecc_double_bit_volatile, 0U);
  EXPECT_FALSE(sample.remapped_rows->pending);
  EXPECT_EQ(sample.temperature_c, 34);
}

TEST(SimFaultTest, ApplyFaultIsTheApiShapedEntryPoint) {
  SimGpuBackend backend(ParseSimGpuSpec("2xH100-80GB"));
  EXPECT_EQ(ParseSimFaultKind("xid"), SimFaultKind::kXid);
  EXPECT_EQ(ParseSimFaultKind("bogus"), std::nullopt);
  EXPECT_THAT(SimFaultKindNames(),
              ElementsAre("xid", "ecc", "row_remap", "lost", "temperature", "clear"));
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kXid, 48}), std::nullopt);
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kEcc, 1}), std::nullopt);
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kTemperature, 97}), std::nullopt);
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kRowRemap, 2}), std::nullopt);
  const GpuSample sample = backend.Sample(1, 0);
  EXPECT_EQ(sample.ecc_double_bit_volatile, 1U);
  EXPECT_EQ(sample.temperature_c, 97);
  EXPECT_TRUE(sample.remapped_rows->failure);
  EXPECT_EQ(backend.PollEvents(0).size(), 1U);
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kLost, 0}), std::nullopt);
  EXPECT_EQ(backend.Sample(1, 0).status, SampleStatus::kGpuLost);
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kClear, 0}), std::nullopt);
  EXPECT_EQ(backend.Sample(1, 0).status, SampleStatus::kOk);

  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kXid, 0}),
            "kind 'xid' needs the XID as a positive code");
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kEcc, 0}),
            "kind 'ecc' needs the number of double-bit errors as code");
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kRowRemap, 3}),
            "kind 'row_remap' needs code 1 (remap pending) or 2 (remap failure)");
  EXPECT_EQ(backend.ApplyFault({1, SimFaultKind::kTemperature, 400}),
            "temperature 400 C is outside -40..150");
  EXPECT_EQ(backend.ApplyFault({5, SimFaultKind::kLost, 0}),
            "no simulated GPU 5 (this node has GPUs 0 to 1)");
}

}  // namespace
}  // namespace gpufleet::agent
