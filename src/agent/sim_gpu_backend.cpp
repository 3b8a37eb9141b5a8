#include "agent/sim_gpu_backend.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/version.h"

namespace gpufleet::agent {
namespace {

// Clocks, thermal slowdown thresholds and idle power are typical nvidia-smi readings; exact
// values vary by board and firmware and only shape the simulation.
constexpr std::array<KnownGpuModel, 7> kKnownModels{{
    {"A100-40GB", "A100", "NVIDIA A100-SXM4-40GB", 40960, 400, 55, 8, 1410, 210, 1215, 88, 0.10},
    {"A100-80GB", "A100", "NVIDIA A100-SXM4-80GB", 81920, 400, 60, 8, 1410, 210, 1593, 88, 0.10},
    {"H100-80GB", "H100", "NVIDIA H100 80GB HBM3", 81559, 700, 70, 8, 1980, 345, 2619, 87, 0.06},
    {"H200-141GB", "H200", "NVIDIA H200", 143771, 700, 75, 8, 1980, 345, 3201, 87, 0.06},
    {"L40S", "L40S", "NVIDIA L40S", 46068, 350, 35, 0, 2520, 210, 9001, 88, 0.13},
    {"T4", "T4", "Tesla T4", 15360, 70, 10, 0, 1590, 300, 5001, 90, 0.60},
    {"V100-32GB", "V100", "Tesla V100-SXM2-32GB", 32768, 300, 40, 8, 1530, 135, 877, 87, 0.15},
}};

constexpr int32_t kMaxSimGpus = 64;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

const KnownGpuModel& RequireKnownModel(std::string_view key, std::string_view where) {
  const KnownGpuModel* model = FindKnownGpuModel(key);
  if (model == nullptr) {
    throw SimSpecError(
        fmt::format("{}unknown GPU model '{}'; known models: {}", where, key, KnownGpuModelKeys()));
  }
  return *model;
}

SimGpuConfig ConfigFromModel(const KnownGpuModel& model) {
  SimGpuConfig config;
  config.model = std::string(model.key);
  config.product_name = std::string(model.product_name);
  config.memory_mib = model.memory_mib;
  config.tdp_w = model.tdp_w;
  config.power_limit_w = model.tdp_w;
  config.idle_power_w = model.idle_power_w;
  config.sm_clock_max_mhz = model.sm_clock_max_mhz;
  config.sm_clock_idle_mhz = model.sm_clock_idle_mhz;
  config.memory_clock_mhz = model.memory_clock_mhz;
  config.slowdown_temperature_c = model.slowdown_temperature_c;
  config.thermal.celsius_per_watt = model.celsius_per_watt;
  return config;
}

// Island of the `position`-th GPU of a group with `group_size` GPUs per island (0 = no NVLink:
// every GPU alone), counting islands from `first_island`.
int32_t IslandFor(int32_t position, int32_t group_size, int32_t first_island) {
  return first_island + (group_size > 0 ? position / group_size : position);
}

void ValidateConfig(const SimGpuConfig& config, std::string_view where) {
  auto fail = [&](std::string_view what) { throw SimSpecError(fmt::format("{}{}", where, what)); };
  if (config.memory_mib <= 0) fail("memory_mib must be positive");
  if (config.tdp_w <= 0) fail("tdp_w must be positive");
  if (config.idle_power_w < 0 || config.idle_power_w > config.tdp_w) {
    fail("idle_power_w must be between 0 and tdp_w");
  }
  if (config.power_limit_w < config.idle_power_w || config.power_limit_w > config.tdp_w) {
    fail("power_limit_w must be between idle_power_w and tdp_w");
  }
  if (config.nvlink_island < 0) fail("nvlink_island must not be negative");
  if (config.thermal.time_constant_s <= 0) fail("thermal.time_constant_s must be positive");
  if (config.thermal.celsius_per_watt < 0) fail("thermal.celsius_per_watt must not be negative");
}

// splitmix64: tiny, fast and identical on every standard library, so jitter and UUIDs are
// reproducible across builds (std::uniform_real_distribution is not).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a64(std::string_view text) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001B3ULL;
  }
  return hash;
}

std::string SimUuid(std::string_view uuid_namespace, int32_t index) {
  uint64_t state = Fnv1a64(fmt::format("{}/{}", uuid_namespace, index));
  const uint64_t high = SplitMix64(state);
  const uint64_t low = SplitMix64(state);
  return fmt::format("GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xFFFF,
                     high & 0xFFFF, low >> 48, low & 0xFFFFFFFFFFFFULL);
}

std::string SimPciBusId(int32_t index) {
  // Spread like a real 8-GPU board (one GPU per PCIe switch), 16 GPUs per PCI domain.
  return fmt::format("{:08X}:{:02X}:00.0", index / 16, 0x18 + (index % 16) * 0x0E);
}

// --- YAML node profile --------------------------------------------------------------------

template <typename T>
T YamlValue(const YAML::Node& node, std::string_view where, std::string_view key) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    throw SimSpecError(fmt::format("{}{}: expected a {} but got '{}'", where, key,
                                   std::is_integral_v<T> ? "whole number" : "number",
                                   node.IsScalar() ? node.Scalar() : std::string("(not a value)")));
  }
}

void RejectUnknownKeys(const YAML::Node& map, std::initializer_list<std::string_view> known,
                       std::string_view where) {
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (std::string_view name : known)
        list += (list.empty() ? "" : ", ") + std::string(name);
      throw SimSpecError(fmt::format("{}unknown key '{}' (known: {})", where, key, list));
    }
  }
}

void ReadThermal(const YAML::Node& node, std::string_view where, SimThermal& thermal) {
  if (!node) return;
  if (!node.IsMap()) throw SimSpecError(fmt::format("{}thermal: expected a map", where));
  RejectUnknownKeys(node, {"ambient_c", "celsius_per_watt", "time_constant_s"},
                    fmt::format("{}thermal: ", where));
  if (node["ambient_c"])
    thermal.ambient_c = YamlValue<double>(node["ambient_c"], where, "ambient_c");
  if (node["celsius_per_watt"]) {
    thermal.celsius_per_watt =
        YamlValue<double>(node["celsius_per_watt"], where, "thermal.celsius_per_watt");
  }
  if (node["time_constant_s"]) {
    thermal.time_constant_s =
        YamlValue<double>(node["time_constant_s"], where, "thermal.time_constant_s");
  }
}

}  // namespace

std::span<const KnownGpuModel> KnownGpuModels() {
  return kKnownModels;
}

const KnownGpuModel* FindKnownGpuModel(std::string_view key) {
  for (const KnownGpuModel& model : kKnownModels) {
    if (EqualsIgnoreCase(model.key, key)) return &model;
  }
  return nullptr;
}

std::string KnownGpuModelKeys() {
  std::string keys;
  for (const KnownGpuModel& model : kKnownModels) {
    if (!keys.empty()) keys += ", ";
    keys += model.key;
  }
  return keys;
}

SimNodeProfile ParseSimGpuSpec(std::string_view spec) {
  const std::string where = fmt::format("--sim-gpus '{}': ", spec);
  const size_t x = spec.find('x');
  if (x == std::string_view::npos || x == 0) {
    throw SimSpecError(
        where + "expected COUNTxMODEL, e.g. 8xH100-80GB; known models: " + KnownGpuModelKeys());
  }
  int32_t count = 0;
  const std::string_view count_text = spec.substr(0, x);
  const auto [count_end, count_error] =
      std::from_chars(count_text.data(), count_text.data() + count_text.size(), count);
  if (count_error != std::errc() || count_end != count_text.data() + count_text.size()) {
    throw SimSpecError(where + fmt::format("'{}' is not a GPU count", count_text));
  }
  if (count < 1 || count > kMaxSimGpus) {
    throw SimSpecError(where + fmt::format("the GPU count must be 1 to {}", kMaxSimGpus));
  }

  std::string_view model_text = spec.substr(x + 1);
  std::optional<int32_t> island_size;
  if (const size_t at = model_text.find('@'); at != std::string_view::npos) {
    const std::string_view island_text = model_text.substr(at + 1);
    int32_t value = -1;
    const auto [end, error] =
        std::from_chars(island_text.data(), island_text.data() + island_text.size(), value);
    if (error != std::errc() || end != island_text.data() + island_text.size() || value < 0 ||
        value > count) {
      throw SimSpecError(where + fmt::format("'@{}' must be the GPUs per NVLink island, 0 to {}",
                                             island_text, count));
    }
    island_size = value;
    model_text = model_text.substr(0, at);
  }
  const KnownGpuModel& model = RequireKnownModel(model_text, where);

  SimNodeProfile profile;
  for (int32_t i = 0; i < count; ++i) {
    SimGpuConfig config = ConfigFromModel(model);
    config.nvlink_island = IslandFor(i, island_size.value_or(model.nvlink_group), 0);
    profile.gpus.push_back(std::move(config));
  }
  return profile;
}

SimNodeProfile ParseSimNodeProfileYaml(std::string_view yaml_text) {
  YAML::Node parsed;
  try {
    parsed = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& error) {
    throw SimSpecError(fmt::format("node profile: {}", error.what()));
  }
  const YAML::Node& root = parsed;  // const: lookups of absent keys must not insert them
  if (!root.IsMap() || !root["gpus"] || !root["gpus"].IsSequence()) {
    throw SimSpecError("node profile: expected a map with a 'gpus' list");
  }
  RejectUnknownKeys(root, {"gpus", "thermal"}, "node profile: ");
  SimThermal node_thermal;
  ReadThermal(root["thermal"], "node profile: ", node_thermal);

  SimNodeProfile profile;
  int32_t next_island = 0;
  const YAML::Node& gpus = root["gpus"];
  for (size_t entry_index = 0; entry_index < gpus.size(); ++entry_index) {
    const YAML::Node entry = gpus[entry_index];
    const std::string where = fmt::format("node profile: gpus[{}]: ", entry_index);
    if (!entry.IsMap() || !entry["model"]) {
      throw SimSpecError(where + "expected a map with at least 'model'");
    }
    RejectUnknownKeys(entry,
                      {"model", "count", "product_name", "memory_mib", "nvlink_island", "tdp_w",
                       "power_limit_w", "idle_power_w", "sm_clock_max_mhz", "sm_clock_idle_mhz",
                       "memory_clock_mhz", "slowdown_temperature_c", "thermal"},
                      where);
    const std::string model_key = entry["model"].as<std::string>();
    const KnownGpuModel* known = FindKnownGpuModel(model_key);
    SimGpuConfig config;
    if (known != nullptr) {
      config = ConfigFromModel(*known);
    } else {
      // A model the table lacks needs its figures spelled out.
      for (const char* required : {"memory_mib", "tdp_w", "idle_power_w"}) {
        if (!entry[required]) {
          throw SimSpecError(fmt::format(
              "{}unknown GPU model '{}' needs memory_mib, tdp_w and idle_power_w (missing {}); "
              "known models: {}",
              where, model_key, required, KnownGpuModelKeys()));
        }
      }
      config.model = model_key;
      config.product_name = model_key;
    }
    config.thermal.ambient_c = node_thermal.ambient_c;
    config.thermal.time_constant_s = node_thermal.time_constant_s;
    if (root["thermal"] && root["thermal"]["celsius_per_watt"]) {
      config.thermal.celsius_per_watt = node_thermal.celsius_per_watt;
    }
    int32_t count = 1;
    if (entry["count"]) count = YamlValue<int32_t>(entry["count"], where, "count");
    if (count < 1 || count > kMaxSimGpus) {
      throw SimSpecError(where + fmt::format("count must be 1 to {}", kMaxSimGpus));
    }
    if (entry["product_name"]) config.product_name = entry["product_name"].as<std::string>();
    if (entry["memory_mib"])
      config.memory_mib = YamlValue<MiB>(entry["memory_mib"], where, "memory_mib");
    if (entry["tdp_w"]) {
      config.tdp_w = YamlValue<double>(entry["tdp_w"], where, "tdp_w");
      config.power_limit_w = config.tdp_w;
    }
    if (entry["power_limit_w"]) {
      config.power_limit_w = YamlValue<double>(entry["power_limit_w"], where, "power_limit_w");
    }
    if (entry["idle_power_w"]) {
      config.idle_power_w = YamlValue<double>(entry["idle_power_w"], where, "idle_power_w");
    }
    auto read_int = [&](const char* key, int32_t& field) {
      if (entry[key]) field = YamlValue<int32_t>(entry[key], where, key);
    };
    read_int("sm_clock_max_mhz", config.sm_clock_max_mhz);
    read_int("sm_clock_idle_mhz", config.sm_clock_idle_mhz);
    read_int("memory_clock_mhz", config.memory_clock_mhz);
    read_int("slowdown_temperature_c", config.slowdown_temperature_c);
    ReadThermal(entry["thermal"], where, config.thermal);

    std::optional<int32_t> explicit_island;
    if (entry["nvlink_island"]) {
      explicit_island = YamlValue<int32_t>(entry["nvlink_island"], where, "nvlink_island");
    }
    const int32_t group = known != nullptr ? known->nvlink_group : 0;
    for (int32_t i = 0; i < count; ++i) {
      SimGpuConfig gpu = config;
      gpu.nvlink_island = explicit_island.value_or(IslandFor(i, group, next_island));
      ValidateConfig(gpu, where);
      profile.gpus.push_back(std::move(gpu));
      if (static_cast<int32_t>(profile.gpus.size()) > kMaxSimGpus) {
        throw SimSpecError(fmt::format("node profile: more than {} GPUs", kMaxSimGpus));
      }
    }
    for (const SimGpuConfig& gpu : profile.gpus) {
      next_island = std::max(next_island, gpu.nvlink_island + 1);
    }
  }
  if (profile.gpus.empty()) throw SimSpecError("node profile: 'gpus' is empty");
  return profile;
}

SimNodeProfile LoadSimNodeProfile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw SimSpecError(fmt::format("cannot read node profile '{}'", path));
  std::ostringstream text;
  text << file.rdbuf();
  try {
    return ParseSimNodeProfileYaml(text.str());
  } catch (const SimSpecError& error) {
    throw SimSpecError(fmt::format("{}: {}", path, error.what()));
  }
}

SimNodeProfile ParseSimGpusArgument(std::string_view argument) {
  if (argument.ends_with(".yaml") || argument.ends_with(".yml")) {
    return LoadSimNodeProfile(std::string(argument));
  }
  return ParseSimGpuSpec(argument);
}

namespace {
constexpr std::array<std::pair<SimFaultKind, const char*>, 6> kFaultKindNames{{
    {SimFaultKind::kXid, "xid"},
    {SimFaultKind::kEcc, "ecc"},
    {SimFaultKind::kRowRemap, "row_remap"},
    {SimFaultKind::kLost, "lost"},
    {SimFaultKind::kTemperature, "temperature"},
    {SimFaultKind::kClear, "clear"},
}};
}  // namespace

std::optional<SimFaultKind> ParseSimFaultKind(std::string_view name) {
  for (const auto& [kind, kind_name] : kFaultKindNames) {
    if (name == kind_name) return kind;
  }
  return std::nullopt;
}

const char* Name(SimFaultKind kind) {
  for (const auto& [candidate, name] : kFaultKindNames) {
    if (candidate == kind) return name;
  }
  return "?";
}

std::vector<std::string> SimFaultKindNames() {
  std::vector<std::string> names;
  for (const auto& entry : kFaultKindNames)
    names.emplace_back(entry.second);
  return names;
}

// --- SimGpuBackend --------------------------------------------------------------------------

SimGpuBackend::SimGpuBackend(SimNodeProfile profile, SimOptions options)
    : options_(std::move(options)), rng_state_(options_.seed) {
  if (profile.gpus.empty()) throw SimSpecError("a simulated node needs at least one GPU");
  for (size_t i = 0; i < profile.gpus.size(); ++i) {
    ValidateConfig(profile.gpus[i], fmt::format("simulated GPU {}: ", i));
    GpuState gpu;
    gpu.config = std::move(profile.gpus[i]);
    gpu.uuid = SimUuid(options_.uuid_namespace, static_cast<int32_t>(i));
    gpu.pci_bus_id = SimPciBusId(static_cast<int32_t>(i));
    // A machine that has been idle for a while: start at the idle steady state.
    gpu.temperature_c =
        gpu.config.thermal.ambient_c + gpu.config.thermal.celsius_per_watt * PowerW(gpu);
    gpus_.push_back(std::move(gpu));
  }
}

std::string SimGpuBackend::DriverVersion() const {
  return fmt::format("sim-{}", kVersion);
}

double SimGpuBackend::PowerW(const GpuState& gpu) const {
  const SimGpuConfig& config = gpu.config;
  const double proportional =
      config.idle_power_w + (config.tdp_w - config.idle_power_w) * gpu.load.utilization;
  return std::min(proportional, config.power_limit_w);
}

GpuInventory SimGpuBackend::Discover() {
  std::lock_guard lock(mutex_);
  GpuInventory inventory;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    const GpuState& gpu = gpus_[i];
    GpuInfo info;
    info.index = static_cast<int32_t>(i);
    info.uuid = gpu.uuid;
    info.product_name = gpu.config.product_name;
    info.model = gpu.config.model;
    info.pci_bus_id = gpu.pci_bus_id;
    info.memory_total_mib = gpu.config.memory_mib;
    info.nvlink_island = gpu.config.nvlink_island;
    info.power_limit_w = gpu.config.power_limit_w;
    info.xid_events_supported = true;
    inventory.gpus.push_back(std::move(info));
  }
  return inventory;
}

void SimGpuBackend::AdvanceLocked(TimeMs now) {
  if (!now_) {
    now_ = now;
    return;
  }
  if (now <= *now_) return;
  const double elapsed_ms = static_cast<double>(now - *now_);
  for (GpuState& gpu : gpus_) {
    // Power is constant between load changes, so both updates are exact for any step length.
    const double power_w = PowerW(gpu);
    gpu.energy_mj += power_w * elapsed_ms;  // W * ms = mJ
    const SimThermal& thermal = gpu.config.thermal;
    const double target_c = thermal.ambient_c + thermal.celsius_per_watt * power_w;
    const double decay = std::exp(-elapsed_ms / (thermal.time_constant_s * kMsPerSecond));
    gpu.temperature_c = target_c + (gpu.temperature_c - target_c) * decay;
  }
  now_ = now;
}

void SimGpuBackend::AdvanceTo(TimeMs now) {
  std::lock_guard lock(mutex_);
  AdvanceLocked(now);
}

void SimGpuBackend::Advance(TimeMs elapsed) {
  std::lock_guard lock(mutex_);
  if (!now_) now_ = 0;
  AdvanceLocked(*now_ + std::max<TimeMs>(elapsed, 0));
}

double SimGpuBackend::NextUnitRandom() {
  return static_cast<double>(SplitMix64(rng_state_) >> 11) * 0x1.0p-53;
}

GpuSample SimGpuBackend::Sample(int32_t index, TimeMs now) {
  std::lock_guard lock(mutex_);
  AdvanceLocked(now);
  GpuSample sample;
  sample.time = now;
  if (auto error = CheckGpu(index)) {
    sample.status = SampleStatus::kUnknownGpu;
    sample.error = *error;
    return sample;
  }
  GpuState& gpu = gpus_[static_cast<size_t>(index)];
  if (gpu.lost) {
    sample.status = SampleStatus::kGpuLost;
    sample.error = "GPU has fallen off the bus (simulated fault)";
    return sample;
  }
  const SimGpuConfig& config = gpu.config;
  const double utilization = gpu.load.utilization;

  if (utilization > 0) {
    const double jitter = (NextUnitRandom() * 2 - 1) * options_.utilization_jitter_percent;
    sample.utilization_percent =
        static_cast<int32_t>(std::clamp(std::round(utilization * 100 + jitter), 0.0, 100.0));
  } else {
    sample.utilization_percent = 0;  // nothing runs, so no kernel was active
  }
  const MiB used = std::min(gpu.load.memory_used_mib, config.memory_mib);
  sample.memory_used_mib = used;
  sample.memory_free_mib = config.memory_mib - used;
  const int32_t temperature_c =
      gpu.temperature_override_c.value_or(static_cast<int32_t>(std::lround(gpu.temperature_c)));
  sample.temperature_c = temperature_c;
  const double power_w = PowerW(gpu);
  sample.power_w = std::round(power_w * 1000) / 1000;  // NVML reports whole milliwatts
  sample.sm_clock_mhz = utilization > 0 ? config.sm_clock_max_mhz : config.sm_clock_idle_mhz;
  sample.memory_clock_mhz = config.memory_clock_mhz;
  sample.total_energy_mj = static_cast<uint64_t>(gpu.energy_mj);
  sample.ecc_single_bit_volatile = gpu.ecc_single_bit;
  sample.ecc_double_bit_volatile = gpu.ecc_double_bit;
  sample.remapped_rows = gpu.remapped_rows;

  uint64_t reasons = 0;
  if (utilization <= 0) reasons |= throttle::kGpuIdle;
  const double uncapped_w =
      config.idle_power_w + (config.tdp_w - config.idle_power_w) * utilization;
  if (uncapped_w > config.power_limit_w) reasons |= throttle::kSwPowerCap;
  if (config.slowdown_temperature_c > 0 && temperature_c >= config.slowdown_temperature_c) {
    reasons |= throttle::kSwThermalSlowdown;
  }
  sample.throttle_reasons = reasons;
  sample.process_ids = gpu.load.process_ids;
  return sample;
}

std::vector<XidEvent> SimGpuBackend::PollEvents(TimeMs now) {
  std::lock_guard lock(mutex_);
  AdvanceLocked(now);
  return std::exchange(pending_events_, {});
}

std::optional<std::string> SimGpuBackend::CheckGpu(int32_t gpu) const {
  if (gpu < 0 || static_cast<size_t>(gpu) >= gpus_.size()) {
    return fmt::format("no simulated GPU {} (this node has GPUs 0 to {})", gpu, gpus_.size() - 1);
  }
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::SetLoad(int32_t gpu, SimGpuLoad load) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  if (!(load.utilization >= 0 && load.utilization <= 1)) {
    return fmt::format("utilization {} is outside 0..1", load.utilization);
  }
  if (load.memory_used_mib < 0) return "memory_used_mib must not be negative";
  gpus_[static_cast<size_t>(gpu)].load = std::move(load);
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::InjectXid(int32_t gpu, uint64_t xid) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  if (xid == 0) return "an XID is a positive number";
  const GpuState& state = gpus_[static_cast<size_t>(gpu)];
  pending_events_.push_back(XidEvent{gpu, state.uuid, xid, now_.value_or(0)});
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::InjectEcc(int32_t gpu, uint64_t double_bit,
                                                    uint64_t single_bit) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  GpuState& state = gpus_[static_cast<size_t>(gpu)];
  state.ecc_double_bit += double_bit;
  state.ecc_single_bit += single_bit;
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::InjectRowRemap(int32_t gpu, bool pending, bool failure) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  RemappedRows& rows = gpus_[static_cast<size_t>(gpu)].remapped_rows;
  if (pending) {
    rows.pending = true;
    ++rows.uncorrectable;
  }
  if (failure) rows.failure = true;
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::MarkLost(int32_t gpu) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  gpus_[static_cast<size_t>(gpu)].lost = true;
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::SetTemperatureOverride(int32_t gpu,
                                                                 std::optional<int32_t> celsius) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  if (celsius && (*celsius < -40 || *celsius > 150)) {
    return fmt::format("temperature {} C is outside -40..150", *celsius);
  }
  gpus_[static_cast<size_t>(gpu)].temperature_override_c = celsius;
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::ClearFaults(int32_t gpu) {
  std::lock_guard lock(mutex_);
  if (auto error = CheckGpu(gpu)) return error;
  GpuState& state = gpus_[static_cast<size_t>(gpu)];
  // What a GPU reset clears: volatile ECC counts, pending remaps, a lost GPU. XIDs already raised
  // stay in the event queue: they happened.
  state.ecc_single_bit = 0;
  state.ecc_double_bit = 0;
  state.remapped_rows = RemappedRows{};
  state.lost = false;
  state.temperature_override_c.reset();
  return std::nullopt;
}

std::optional<std::string> SimGpuBackend::ApplyFault(const SimFault& fault) {
  switch (fault.kind) {
    case SimFaultKind::kXid:
      if (fault.code <= 0) return "kind 'xid' needs the XID as a positive code";
      return InjectXid(fault.gpu, static_cast<uint64_t>(fault.code));
    case SimFaultKind::kEcc:
      if (fault.code <= 0) return "kind 'ecc' needs the number of double-bit errors as code";
      return InjectEcc(fault.gpu, static_cast<uint64_t>(fault.code));
    case SimFaultKind::kRowRemap:
      if (fault.code != 1 && fault.code != 2) {
        return "kind 'row_remap' needs code 1 (remap pending) or 2 (remap failure)";
      }
      return InjectRowRemap(fault.gpu, fault.code == 1, fault.code == 2);
    case SimFaultKind::kLost:
      return MarkLost(fault.gpu);
    case SimFaultKind::kTemperature:
      return SetTemperatureOverride(
          fault.gpu, static_cast<int32_t>(std::clamp<int64_t>(fault.code, -1000, 1000)));
    case SimFaultKind::kClear:
      return ClearFaults(fault.gpu);
  }
  return "unknown fault kind";
}

}  // namespace gpufleet::agent
