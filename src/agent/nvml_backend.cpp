#include "agent/nvml_backend.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include <dlfcn.h>
#include <fmt/format.h>

#include "agent/sim_gpu_backend.h"

namespace gpufleet::agent {
namespace {

// Our own declarations of the parts of NVML's C ABI we use (nvml.h is not installed on the
// machines that build the agent). Layouts and values follow NVML's public header (API version
// 12); the static_asserts pin the sizes the driver expects.
namespace nvml {

using Return = unsigned int;  // nvmlReturn_t: a C enum of non-negative values
using Device = struct DeviceOpaque*;
using EventSet = struct EventSetOpaque*;

constexpr Return kSuccess = 0;
constexpr Return kErrorInvalidArgument = 2;
constexpr Return kErrorNotSupported = 3;
constexpr Return kErrorNoPermission = 4;
constexpr Return kErrorInsufficientSize = 7;
constexpr Return kErrorTimeout = 10;
constexpr Return kErrorFunctionNotFound = 13;
constexpr Return kErrorGpuIsLost = 15;
constexpr Return kErrorArgumentVersionMismatch = 25;

constexpr unsigned int kTemperatureGpu = 0;              // NVML_TEMPERATURE_GPU
constexpr unsigned int kClockSm = 1;                     // NVML_CLOCK_SM
constexpr unsigned int kClockMem = 2;                    // NVML_CLOCK_MEM
constexpr unsigned int kMemoryErrorCorrected = 0;        // NVML_MEMORY_ERROR_TYPE_CORRECTED
constexpr unsigned int kMemoryErrorUncorrected = 1;      // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr unsigned int kVolatileEcc = 0;                 // NVML_VOLATILE_ECC
constexpr unsigned int kFeatureEnabled = 1;              // NVML_FEATURE_ENABLED
constexpr unsigned int kP2pCapsIndexNvlink = 2;          // NVML_P2P_CAPS_INDEX_NVLINK
constexpr unsigned int kP2pStatusOk = 0;                 // NVML_P2P_STATUS_OK
constexpr unsigned int kMigEnabled = 1;                  // NVML_DEVICE_MIG_ENABLE
constexpr unsigned int kInvalidInstanceId = 0xFFFFFFFF;  // an event of the whole GPU
constexpr unsigned long long kEventTypeXidCriticalError = 0x8;
constexpr unsigned int kNvLinkMaxLinks = 18;    // NVML_NVLINK_MAX_LINKS
constexpr unsigned int kStringBufferSize = 96;  // NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE
constexpr unsigned int kDriverVersionBufferSize = 80;

struct PciInfo {  // nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};
static_assert(sizeof(PciInfo) == 68);
static_assert(offsetof(PciInfo, bus_id) == 36);

struct Memory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(Memory) == 24);

struct MemoryV2 {  // nvmlMemory_v2_t
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(MemoryV2) == 40);
static_assert(offsetof(MemoryV2, total) == 8);
// NVML_STRUCT_VERSION(Memory, 2)
constexpr unsigned int kMemoryV2Version = static_cast<unsigned int>(sizeof(MemoryV2)) | (2U << 24);

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
static_assert(sizeof(Utilization) == 8);

struct ProcessInfo {  // nvmlProcessInfo_v2_t, what the _v3 process queries fill
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(ProcessInfo) == 24);

struct EventData {  // nvmlEventData_t as nvmlEventSetWait_v2 fills it
  Device device;
  unsigned long long event_type;
  unsigned long long event_data;  // the XID for nvmlEventTypeXidCriticalError
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(EventData) == 32);
static_assert(offsetof(EventData, event_data) == 16);

}  // namespace nvml

// A (domain, bus, device) PCI address: compared numerically because the legacy and the current
// bus id strings differ in format.
using PciKey = std::tuple<unsigned int, unsigned int, unsigned int>;
PciKey KeyOf(const nvml::PciInfo& pci) {
  return {pci.domain, pci.bus, pci.device};
}

// The bytes up to the first NUL, never past the buffer.
std::string FromBuffer(const char* buffer, size_t size) {
  return std::string(buffer, std::find(buffer, buffer + size, '\0'));
}

class UnionFind {
 public:
  explicit UnionFind(size_t size) : parent_(size) {
    std::iota(parent_.begin(), parent_.end(), size_t{0});
  }
  size_t Find(size_t x) {
    while (parent_[x] != x)
      x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Join(size_t a, size_t b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<size_t> parent_;
};

}  // namespace

struct NvmlBackend::State {
  void* library = nullptr;
  std::string library_path;
  std::vector<std::string> missing_functions;

  // Required: without these there is nothing to report.
  nvml::Return (*init_v2)() = nullptr;
  nvml::Return (*shutdown)() = nullptr;
  nvml::Return (*device_get_count_v2)(unsigned int*) = nullptr;
  nvml::Return (*device_get_handle_by_index_v2)(unsigned int, nvml::Device*) = nullptr;
  nvml::Return (*device_get_uuid)(nvml::Device, char*, unsigned int) = nullptr;
  // Optional: a missing one makes its field "not supported".
  const char* (*error_string)(nvml::Return) = nullptr;
  nvml::Return (*system_get_driver_version)(char*, unsigned int) = nullptr;
  nvml::Return (*device_get_name)(nvml::Device, char*, unsigned int) = nullptr;
  nvml::Return (*device_get_minor_number)(nvml::Device, unsigned int*) = nullptr;
  nvml::Return (*device_get_pci_info_v3)(nvml::Device, nvml::PciInfo*) = nullptr;
  nvml::Return (*device_get_memory_info_v2)(nvml::Device, nvml::MemoryV2*) = nullptr;
  nvml::Return (*device_get_memory_info)(nvml::Device, nvml::Memory*) = nullptr;
  nvml::Return (*device_get_utilization_rates)(nvml::Device, nvml::Utilization*) = nullptr;
  nvml::Return (*device_get_temperature)(nvml::Device, unsigned int, unsigned int*) = nullptr;
  nvml::Return (*device_get_power_usage)(nvml::Device, unsigned int*) = nullptr;
  nvml::Return (*device_get_enforced_power_limit)(nvml::Device, unsigned int*) = nullptr;
  nvml::Return (*device_get_clock_info)(nvml::Device, unsigned int, unsigned int*) = nullptr;
  nvml::Return (*device_get_total_energy_consumption)(nvml::Device, unsigned long long*) = nullptr;
  nvml::Return (*device_get_total_ecc_errors)(nvml::Device, unsigned int, unsigned int,
                                              unsigned long long*) = nullptr;
  nvml::Return (*device_get_remapped_rows)(nvml::Device, unsigned int*, unsigned int*,
                                           unsigned int*, unsigned int*) = nullptr;
  nvml::Return (*device_get_throttle_reasons)(nvml::Device, unsigned long long*) = nullptr;
  nvml::Return (*device_get_compute_running_processes_v3)(nvml::Device, unsigned int*,
                                                          nvml::ProcessInfo*) = nullptr;
  nvml::Return (*device_get_nvlink_state)(nvml::Device, unsigned int, unsigned int*) = nullptr;
  nvml::Return (*device_get_nvlink_remote_pci_info_v2)(nvml::Device, unsigned int,
                                                       nvml::PciInfo*) = nullptr;
  nvml::Return (*device_get_p2p_status)(nvml::Device, nvml::Device, unsigned int,
                                        unsigned int*) = nullptr;
  nvml::Return (*event_set_create)(nvml::EventSet*) = nullptr;
  nvml::Return (*device_register_events)(nvml::Device, unsigned long long,
                                         nvml::EventSet) = nullptr;
  nvml::Return (*event_set_wait)(nvml::EventSet, nvml::EventData*, unsigned int) = nullptr;
  nvml::Return (*event_set_free)(nvml::EventSet) = nullptr;
  nvml::Return (*device_get_mig_mode)(nvml::Device, unsigned int*, unsigned int*) = nullptr;
  nvml::Return (*device_get_max_mig_device_count)(nvml::Device, unsigned int*) = nullptr;
  nvml::Return (*device_get_mig_device_handle_by_index)(nvml::Device, unsigned int,
                                                        nvml::Device*) = nullptr;
  nvml::Return (*device_get_gpu_instance_id)(nvml::Device, unsigned int*) = nullptr;
  nvml::Return (*device_get_compute_instance_id)(nvml::Device, unsigned int*) = nullptr;

  bool initialized = false;
  std::string driver_version;
  GpuInventory inventory;
  // By GpuInfo::index: NVML's index for whole GPUs, from the GPU count upwards for MIG instances;
  // null for GPUs left out of the inventory (and for GPUs in MIG mode, offered as instances).
  std::vector<nvml::Device> handles;
  std::string mig_minors_path;
  // GPUs in MIG mode: XIDs arrive on them, naming the GPU instance.
  struct MigParent {
    nvml::Device device = nullptr;
    std::vector<size_t> instances;  // positions in inventory.gpus
  };
  std::vector<MigParent> mig_parents;
  nvml::EventSet event_set = nullptr;
  std::mutex events_mutex;  // NVML does not promise that concurrent waits on one set are safe

  ~State() {
    if (event_set != nullptr && event_set_free != nullptr) event_set_free(event_set);
    if (initialized) shutdown();
    if (library != nullptr) dlclose(library);
  }

  template <typename Function>
  bool Resolve(const char* name, Function& function) {
    // POSIX guarantees dlsym's object pointer converts to a function pointer.
    function = reinterpret_cast<Function>(dlsym(library, name));
    return function != nullptr;
  }

  template <typename Function>
  void ResolveOptional(const char* name, Function& function) {
    if (!Resolve(name, function)) missing_functions.emplace_back(name);
  }

  // For functions NVML renamed or versioned: the older name has the same signature.
  template <typename Function>
  void ResolveOptional(const char* name, const char* older_name, Function& function) {
    if (!Resolve(name, function) && !Resolve(older_name, function)) {
      missing_functions.emplace_back(name);
    }
  }

  std::string ErrorText(nvml::Return result) const {
    const char* text = error_string != nullptr ? error_string(result) : nullptr;
    return text != nullptr ? fmt::format("{} (NVML error {})", text, result)
                           : fmt::format("NVML error {}", result);
  }

  std::string ReadString(nvml::Return (*function)(nvml::Device, char*, unsigned int),
                         nvml::Device device, nvml::Return& result) const {
    char buffer[nvml::kStringBufferSize] = {};
    result = function(device, buffer, sizeof(buffer));
    return FromBuffer(buffer, sizeof(buffer));
  }

  void Enumerate();
  MiB MemoryTotalMib(nvml::Device device) const;
  std::string ProductName(nvml::Device device) const;  // empty when the driver does not say
  // Adds the MIG instances of `parent` (a GPU in MIG mode, minor number `minor` if known) to the
  // inventory, as devices with indices from `next_index` and islands from `next_island`.
  void AddMigInstances(const GpuInfo& parent, nvml::Device device, std::optional<unsigned> minor,
                       const std::map<std::string, unsigned>& cap_minors, int32_t& next_index,
                       int32_t& next_island);
  std::vector<int32_t> NvlinkIslands(const std::vector<nvml::Device>& devices,
                                     const std::vector<std::optional<PciKey>>& addresses);
  void RegisterEvents();
};

namespace {

bool IsNotSupported(nvml::Return result) {
  return result == nvml::kErrorNotSupported || result == nvml::kErrorFunctionNotFound;
}

// Reads the optional fields of one sample: records why a read failed (unless the field is just
// not supported) and notices a lost GPU, after which nothing more is asked of it.
class FieldReader {
 public:
  FieldReader(const NvmlBackend::State& state, GpuSample& sample)
      : state_(state), sample_(sample) {}

  bool lost() const { return lost_; }
  // Whether `function` is there to call and the GPU is still answering.
  template <typename Function>
  bool CanCall(Function function) const {
    return function != nullptr && !lost_;
  }
  bool Ok(nvml::Return result, std::string_view function) {
    if (result == nvml::kSuccess) return true;
    if (result == nvml::kErrorGpuIsLost) {
      lost_ = true;
      lost_message_ = fmt::format("{}: {}", function, state_.ErrorText(result));
    } else if (!IsNotSupported(result)) {
      sample_.warnings.push_back(fmt::format("{}: {}", function, state_.ErrorText(result)));
    }
    return false;
  }
  const std::string& lost_message() const { return lost_message_; }

 private:
  const NvmlBackend::State& state_;
  GpuSample& sample_;
  bool lost_ = false;
  std::string lost_message_;
};

MiB BytesToMiB(unsigned long long bytes) {
  return static_cast<MiB>(bytes >> 20);
}

std::vector<std::string_view> Words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ' ' || text[i] == '-') {
      if (i > start) words.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return words;
}

// "NVIDIA H100 80GB HBM3 MIG 3g.40gb" -> "3g.40gb"; "" when the name has no profile.
std::string MigProfileOf(std::string_view name) {
  const size_t at = name.rfind("MIG ");
  if (at == std::string_view::npos) return "";
  std::string_view profile = name.substr(at + 4);
  return std::string(profile.substr(0, profile.find(' ')));
}

// The driver's "gpu0/gi1/access 12" lines (and "config 1", "monitor 2"); empty when the file is
// not there (no MIG support in the driver).
std::map<std::string, unsigned> ReadMigMinors(const std::string& path) {
  std::map<std::string, unsigned> minors;
  std::ifstream file(path);
  std::string name;
  unsigned minor = 0;
  while (file >> name >> minor)
    minors[name] = minor;
  return minors;
}

}  // namespace

void NvmlBackend::State::Enumerate() {
  unsigned int count = 0;
  if (const nvml::Return result = device_get_count_v2(&count); result != nvml::kSuccess) {
    inventory.problems.push_back(
        fmt::format("nvmlDeviceGetCount_v2 failed: {}", ErrorText(result)));
    return;
  }
  handles.assign(count, nullptr);
  std::vector<nvml::Device> devices;  // of the GPUs in the inventory, in index order
  std::vector<std::optional<PciKey>> addresses;
  struct InMigMode {
    GpuInfo info;
    nvml::Device device;
    std::optional<unsigned> minor;
  };
  std::vector<InMigMode> in_mig_mode;
  for (unsigned int index = 0; index < count; ++index) {
    nvml::Device device = nullptr;
    nvml::Return result = device_get_handle_by_index_v2(index, &device);
    if (result != nvml::kSuccess) {
      inventory.problems.push_back(fmt::format("GPU {}: nvmlDeviceGetHandleByIndex_v2 failed: {}",
                                               index, ErrorText(result)));
      continue;
    }
    GpuInfo info;
    info.index = static_cast<int32_t>(index);
    info.uuid = ReadString(device_get_uuid, device, result);
    if (result != nvml::kSuccess || info.uuid.empty()) {
      // The UUID is the key the rest of gpufleet uses: a GPU without one cannot be scheduled.
      inventory.problems.push_back(
          fmt::format("GPU {}: nvmlDeviceGetUUID failed: {}", index, ErrorText(result)));
      continue;
    }
    info.product_name = ProductName(device);
    // The driver names each GPU's device node by its minor number, not its NVML index.
    std::optional<unsigned> minor;
    if (unsigned int number = 0; device_get_minor_number != nullptr &&
                                 device_get_minor_number(device, &number) == nvml::kSuccess) {
      minor = number;
      info.device_files.push_back(fmt::format("/dev/nvidia{}", number));
    }
    nvml::PciInfo pci{};
    std::optional<PciKey> address;
    if (device_get_pci_info_v3 != nullptr &&
        device_get_pci_info_v3(device, &pci) == nvml::kSuccess) {
      info.pci_bus_id = FromBuffer(pci.bus_id, sizeof(pci.bus_id));
      address = KeyOf(pci);
    }
    info.memory_total_mib = MemoryTotalMib(device);
    unsigned int limit_mw = 0;
    if (device_get_enforced_power_limit != nullptr &&
        device_get_enforced_power_limit(device, &limit_mw) == nvml::kSuccess) {
      info.power_limit_w = limit_mw / 1000.0;
    }
    info.model = info.product_name.empty() ? std::string("unknown")
                                           : GpuModelKey(info.product_name, info.memory_total_mib);
    unsigned int mig_mode = 0, pending_mig_mode = 0;
    if (device_get_mig_mode != nullptr &&
        device_get_mig_mode(device, &mig_mode, &pending_mig_mode) == nvml::kSuccess) {
      if (mig_mode != pending_mig_mode)
        inventory.problems.push_back(
            fmt::format("GPU {}: MIG mode {} waits for a GPU reset; offered as it is now ({})",
                        index, pending_mig_mode == nvml::kMigEnabled ? "on" : "off",
                        mig_mode == nvml::kMigEnabled ? "MIG instances" : "the whole GPU"));
      if (mig_mode == nvml::kMigEnabled) {
        in_mig_mode.push_back({std::move(info), device, minor});
        continue;
      }
    }
    handles[index] = device;
    devices.push_back(device);
    addresses.push_back(address);
    inventory.gpus.push_back(std::move(info));
  }
  const std::vector<int32_t> islands = NvlinkIslands(devices, addresses);
  for (size_t i = 0; i < inventory.gpus.size(); ++i)
    inventory.gpus[i].nvlink_island = islands[i];
  if (in_mig_mode.empty()) return;
  const std::map<std::string, unsigned> cap_minors = ReadMigMinors(mig_minors_path);
  auto next_index = static_cast<int32_t>(count);
  int32_t next_island = islands.empty() ? 0 : *std::max_element(islands.begin(), islands.end()) + 1;
  for (const InMigMode& gpu : in_mig_mode)
    AddMigInstances(gpu.info, gpu.device, gpu.minor, cap_minors, next_index, next_island);
}

std::string NvmlBackend::State::ProductName(nvml::Device device) const {
  if (device_get_name == nullptr) return "";
  nvml::Return result = nvml::kSuccess;
  std::string name = ReadString(device_get_name, device, result);
  return result == nvml::kSuccess ? name : "";
}

MiB NvmlBackend::State::MemoryTotalMib(nvml::Device device) const {
  nvml::MemoryV2 memory_v2{};
  memory_v2.version = nvml::kMemoryV2Version;
  nvml::Memory memory_v1{};
  if (device_get_memory_info_v2 != nullptr &&
      device_get_memory_info_v2(device, &memory_v2) == nvml::kSuccess)
    return BytesToMiB(memory_v2.total);
  if (device_get_memory_info != nullptr &&
      device_get_memory_info(device, &memory_v1) == nvml::kSuccess)
    return BytesToMiB(memory_v1.total);
  return 0;
}

void NvmlBackend::State::AddMigInstances(const GpuInfo& parent, nvml::Device device,
                                         std::optional<unsigned> minor,
                                         const std::map<std::string, unsigned>& cap_minors,
                                         int32_t& next_index, int32_t& next_island) {
  unsigned int slots = 0;
  if (device_get_max_mig_device_count == nullptr ||
      device_get_mig_device_handle_by_index == nullptr || device_get_gpu_instance_id == nullptr ||
      device_get_compute_instance_id == nullptr ||
      device_get_max_mig_device_count(device, &slots) != nvml::kSuccess) {
    inventory.problems.push_back(fmt::format(
        "GPU {} is in MIG mode, but this driver does not list its MIG instances: not offered",
        parent.index));
    return;
  }
  MigParent record;
  record.device = device;
  for (unsigned int slot = 0; slot < slots; ++slot) {
    nvml::Device instance = nullptr;
    // An empty slot answers "not found".
    if (device_get_mig_device_handle_by_index(device, slot, &instance) != nvml::kSuccess ||
        instance == nullptr)
      continue;
    GpuInfo info;
    nvml::Return result = nvml::kSuccess;
    info.uuid = ReadString(device_get_uuid, instance, result);
    MigInstance mig;
    mig.parent_index = parent.index;
    mig.parent_uuid = parent.uuid;
    unsigned int gpu_instance = 0, compute_instance = 0;
    if (result != nvml::kSuccess || info.uuid.empty() ||
        device_get_gpu_instance_id(instance, &gpu_instance) != nvml::kSuccess ||
        device_get_compute_instance_id(instance, &compute_instance) != nvml::kSuccess) {
      inventory.problems.push_back(fmt::format(
          "GPU {} MIG device {}: no UUID or instance ids: not offered", parent.index, slot));
      continue;
    }
    mig.gpu_instance_id = gpu_instance;
    mig.compute_instance_id = compute_instance;
    info.product_name = ProductName(instance);
    info.memory_total_mib = MemoryTotalMib(instance);
    mig.profile = MigProfileOf(info.product_name);
    if (mig.profile.empty()) mig.profile = fmt::format("{}gb", info.memory_total_mib / 1024);
    info.model = fmt::format("{}-MIG-{}", parent.model, mig.profile);
    info.pci_bus_id = parent.pci_bus_id;
    // Its GPU's device node, which its neighbours on that GPU open too, and the capabilities of
    // its own GPU and compute instance, which no other workload may open.
    info.device_files = parent.device_files;
    const std::string gi_key = fmt::format("gpu{}/gi{}/access", minor.value_or(0), gpu_instance);
    const std::string ci_key =
        fmt::format("gpu{}/gi{}/ci{}/access", minor.value_or(0), gpu_instance, compute_instance);
    const auto gi_cap = cap_minors.find(gi_key);
    const auto ci_cap = cap_minors.find(ci_key);
    if (minor && gi_cap != cap_minors.end() && ci_cap != cap_minors.end()) {
      info.device_files.push_back(fmt::format("/dev/nvidia-caps/nvidia-cap{}", gi_cap->second));
      info.device_files.push_back(fmt::format("/dev/nvidia-caps/nvidia-cap{}", ci_cap->second));
    } else {
      inventory.problems.push_back(fmt::format(
          "GPU {} MIG {} (GPU instance {}): no capability minors for it in {}: other workloads "
          "cannot be kept from opening it",
          parent.index, mig.profile, gpu_instance, mig_minors_path));
    }
    info.mig = std::move(mig);
    info.index = next_index++;
    // CUDA runs a process on one MIG instance only: each is an island of its own.
    info.nvlink_island = next_island++;
    handles.push_back(instance);
    record.instances.push_back(inventory.gpus.size());
    inventory.gpus.push_back(std::move(info));
  }
  if (record.instances.empty())
    inventory.problems.push_back(
        fmt::format("GPU {} is in MIG mode with no MIG instances: nothing can run on it until "
                    "some are made (nvidia-smi mig -cgi PROFILES -C)",
                    parent.index));
  mig_parents.push_back(std::move(record));
}

std::vector<int32_t> NvmlBackend::State::NvlinkIslands(
    const std::vector<nvml::Device>& devices, const std::vector<std::optional<PciKey>>& addresses) {
  const size_t count = devices.size();
  UnionFind islands(count);
  std::map<PciKey, size_t> first_gpu_on_switch;  // a non-GPU link end: an NVSwitch (or bridge)
  std::vector<size_t> unresolved;  // GPUs with active links whose far end NVML would not name
  for (size_t i = 0; i < count && device_get_nvlink_state != nullptr; ++i) {
    bool has_unresolved_link = false;
    for (unsigned int link = 0; link < nvml::kNvLinkMaxLinks; ++link) {
      unsigned int active = 0;
      const nvml::Return state_result = device_get_nvlink_state(devices[i], link, &active);
      if (state_result == nvml::kErrorNotSupported) break;  // no NVLink on this GPU
      // Links past the GPU's last one answer "invalid argument"; skip them and any errors.
      if (state_result != nvml::kSuccess || active != nvml::kFeatureEnabled) continue;
      nvml::PciInfo remote{};
      if (device_get_nvlink_remote_pci_info_v2 == nullptr ||
          device_get_nvlink_remote_pci_info_v2(devices[i], link, &remote) != nvml::kSuccess) {
        has_unresolved_link = true;
        continue;
      }
      const PciKey far_end = KeyOf(remote);
      const auto peer = std::find(addresses.begin(), addresses.end(), std::optional(far_end));
      if (peer != addresses.end()) {
        islands.Join(i, static_cast<size_t>(peer - addresses.begin()));
      } else {
        // GPUs on the same switch are one island (unnamed switches all report one address).
        const auto [entry, inserted] = first_gpu_on_switch.emplace(far_end, i);
        if (!inserted) islands.Join(i, entry->second);
      }
    }
    if (has_unresolved_link) unresolved.push_back(i);
  }
  // Far ends NVML would not name: ask directly whether two such GPUs talk over NVLink.
  for (size_t a = 0; a < unresolved.size(); ++a) {
    for (size_t b = a + 1; b < unresolved.size(); ++b) {
      unsigned int status = ~0U;
      if (device_get_p2p_status != nullptr &&
          device_get_p2p_status(devices[unresolved[a]], devices[unresolved[b]],
                                nvml::kP2pCapsIndexNvlink, &status) == nvml::kSuccess &&
          status == nvml::kP2pStatusOk) {
        islands.Join(unresolved[a], unresolved[b]);
      }
    }
  }
  if (!unresolved.empty() && device_get_p2p_status == nullptr) {
    inventory.problems.push_back(
        "NVLink peers could not be identified (nvmlDeviceGetNvLinkRemotePciInfo_v2 and "
        "nvmlDeviceGetP2PStatus unavailable): GPUs with NVLink are reported as separate islands");
  }
  // Dense ids in order of each island's lowest GPU.
  std::vector<int32_t> ids(count, -1);
  std::map<size_t, int32_t> id_of_root;
  for (size_t i = 0; i < count; ++i) {
    const auto [entry, inserted] =
        id_of_root.emplace(islands.Find(i), static_cast<int32_t>(id_of_root.size()));
    ids[i] = entry->second;
  }
  return ids;
}

void NvmlBackend::State::RegisterEvents() {
  if (event_set_create == nullptr || device_register_events == nullptr ||
      event_set_wait == nullptr) {
    return;
  }
  if (const nvml::Return result = event_set_create(&event_set); result != nvml::kSuccess) {
    event_set = nullptr;
    inventory.problems.push_back(fmt::format(
        "nvmlEventSetCreate failed: {}: XID errors will not be seen", ErrorText(result)));
    return;
  }
  for (const MigParent& parent : mig_parents) {
    const nvml::Return result =
        device_register_events(parent.device, nvml::kEventTypeXidCriticalError, event_set);
    for (size_t position : parent.instances)
      inventory.gpus[position].xid_events_supported = result == nvml::kSuccess;
  }
  for (GpuInfo& gpu : inventory.gpus) {
    if (gpu.mig) continue;  // registered on its GPU, above
    const nvml::Return result = device_register_events(handles[static_cast<size_t>(gpu.index)],
                                                       nvml::kEventTypeXidCriticalError, event_set);
    gpu.xid_events_supported = result == nvml::kSuccess;
    if (result != nvml::kSuccess && !IsNotSupported(result)) {
      inventory.problems.push_back(
          fmt::format("GPU {}: XID events unavailable: {}", gpu.index, ErrorText(result)));
    }
  }
}

NvmlBackend::LoadResult NvmlBackend::Load(const NvmlOptions& options) {
  auto state = std::make_unique<State>();
  state->library_path = options.library_path;
  state->library = dlopen(options.library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (state->library == nullptr) {
    const char* reason = dlerror();
    return {nullptr,
            fmt::format("cannot load NVML ({}): {}. Is the NVIDIA driver installed? To run "
                        "without GPUs, simulate them with --sim-gpus COUNTxMODEL (e.g. "
                        "--sim-gpus 8xH100-80GB)",
                        options.library_path, reason != nullptr ? reason : "unknown error")};
  }

  std::vector<std::string> missing_required;
  auto require = [&](const char* name, auto& function) {
    if (!state->Resolve(name, function)) missing_required.emplace_back(name);
  };
  require("nvmlInit_v2", state->init_v2);
  require("nvmlShutdown", state->shutdown);
  require("nvmlDeviceGetCount_v2", state->device_get_count_v2);
  require("nvmlDeviceGetHandleByIndex_v2", state->device_get_handle_by_index_v2);
  require("nvmlDeviceGetUUID", state->device_get_uuid);
  if (!missing_required.empty()) {
    std::string names;
    for (const std::string& name : missing_required)
      names += (names.empty() ? "" : ", ") + name;
    return {nullptr, fmt::format("{} is not a usable NVML library: it lacks {} (driver too old?)",
                                 options.library_path, names)};
  }
  state->ResolveOptional("nvmlErrorString", state->error_string);
  state->ResolveOptional("nvmlSystemGetDriverVersion", state->system_get_driver_version);
  state->ResolveOptional("nvmlDeviceGetName", state->device_get_name);
  state->ResolveOptional("nvmlDeviceGetMinorNumber", state->device_get_minor_number);
  state->ResolveOptional("nvmlDeviceGetPciInfo_v3", state->device_get_pci_info_v3);
  state->ResolveOptional("nvmlDeviceGetMemoryInfo_v2", state->device_get_memory_info_v2);
  state->ResolveOptional("nvmlDeviceGetMemoryInfo", state->device_get_memory_info);
  state->ResolveOptional("nvmlDeviceGetUtilizationRates", state->device_get_utilization_rates);
  state->ResolveOptional("nvmlDeviceGetTemperature", state->device_get_temperature);
  state->ResolveOptional("nvmlDeviceGetPowerUsage", state->device_get_power_usage);
  state->ResolveOptional("nvmlDeviceGetEnforcedPowerLimit", state->device_get_enforced_power_limit);
  state->ResolveOptional("nvmlDeviceGetClockInfo", state->device_get_clock_info);
  state->ResolveOptional("nvmlDeviceGetTotalEnergyConsumption",
                         state->device_get_total_energy_consumption);
  state->ResolveOptional("nvmlDeviceGetTotalEccErrors", state->device_get_total_ecc_errors);
  state->ResolveOptional("nvmlDeviceGetRemappedRows", state->device_get_remapped_rows);
  // Renamed to "clocks event reasons" in R535, which keeps the old name as well.
  state->ResolveOptional("nvmlDeviceGetCurrentClocksThrottleReasons",
                         "nvmlDeviceGetCurrentClocksEventReasons",
                         state->device_get_throttle_reasons);
  state->ResolveOptional("nvmlDeviceGetComputeRunningProcesses_v3",
                         state->device_get_compute_running_processes_v3);
  state->ResolveOptional("nvmlDeviceGetNvLinkState", state->device_get_nvlink_state);
  state->ResolveOptional("nvmlDeviceGetNvLinkRemotePciInfo_v2",
                         state->device_get_nvlink_remote_pci_info_v2);
  state->ResolveOptional("nvmlDeviceGetP2PStatus", state->device_get_p2p_status);
  state->ResolveOptional("nvmlEventSetCreate", state->event_set_create);
  state->ResolveOptional("nvmlDeviceRegisterEvents", state->device_register_events);
  // The v1 call fills the first 24 bytes of the same struct.
  state->ResolveOptional("nvmlEventSetWait_v2", "nvmlEventSetWait", state->event_set_wait);
  state->ResolveOptional("nvmlEventSetFree", state->event_set_free);
  state->ResolveOptional("nvmlDeviceGetMigMode", state->device_get_mig_mode);
  state->ResolveOptional("nvmlDeviceGetMaxMigDeviceCount", state->device_get_max_mig_device_count);
  state->ResolveOptional("nvmlDeviceGetMigDeviceHandleByIndex",
                         state->device_get_mig_device_handle_by_index);
  state->ResolveOptional("nvmlDeviceGetGpuInstanceId", state->device_get_gpu_instance_id);
  state->ResolveOptional("nvmlDeviceGetComputeInstanceId", state->device_get_compute_instance_id);
  state->mig_minors_path = options.mig_minors_path;

  if (const nvml::Return result = state->init_v2(); result != nvml::kSuccess) {
    return {nullptr, fmt::format("nvmlInit_v2 failed: {}. Is the NVIDIA kernel driver loaded?",
                                 state->ErrorText(result))};
  }
  state->initialized = true;
  if (state->system_get_driver_version != nullptr) {
    char buffer[nvml::kDriverVersionBufferSize] = {};
    if (state->system_get_driver_version(buffer, sizeof(buffer)) == nvml::kSuccess) {
      state->driver_version = FromBuffer(buffer, sizeof(buffer));
    }
  }
  state->Enumerate();
  state->RegisterEvents();
  return {std::unique_ptr<NvmlBackend>(new NvmlBackend(std::move(state))), ""};
}

NvmlBackend::NvmlBackend(std::unique_ptr<State> state) : state_(std::move(state)) {}

NvmlBackend::~NvmlBackend() = default;

std::string NvmlBackend::DriverVersion() const {
  return state_->driver_version;
}

GpuInventory NvmlBackend::Discover() {
  return state_->inventory;
}

std::vector<std::string> NvmlBackend::MissingFunctions() const {
  return state_->missing_functions;
}

GpuSample NvmlBackend::Sample(int32_t index, TimeMs now) {
  const State& s = *state_;
  GpuSample sample;
  sample.time = now;
  if (index < 0 || static_cast<size_t>(index) >= s.handles.size() ||
      s.handles[static_cast<size_t>(index)] == nullptr) {
    sample.status = SampleStatus::kUnknownGpu;
    sample.error = fmt::format("no usable GPU with index {}", index);
    return sample;
  }
  const nvml::Device device = s.handles[static_cast<size_t>(index)];
  FieldReader reader(s, sample);

  if (reader.CanCall(s.device_get_utilization_rates)) {
    nvml::Utilization utilization{};
    if (reader.Ok(s.device_get_utilization_rates(device, &utilization),
                  "nvmlDeviceGetUtilizationRates")) {
      sample.utilization_percent = static_cast<int32_t>(utilization.gpu);
    }
  }
  if (reader.CanCall(s.device_get_memory_info_v2)) {
    nvml::MemoryV2 memory{};
    memory.version = nvml::kMemoryV2Version;
    const nvml::Return result = s.device_get_memory_info_v2(device, &memory);
    if (result == nvml::kErrorArgumentVersionMismatch) {
      // Fall through to v1 below.
    } else if (reader.Ok(result, "nvmlDeviceGetMemoryInfo_v2")) {
      sample.memory_used_mib = BytesToMiB(memory.used);
      sample.memory_free_mib = BytesToMiB(memory.free);
    }
  }
  if (!sample.memory_used_mib && reader.CanCall(s.device_get_memory_info)) {
    nvml::Memory memory{};
    if (reader.Ok(s.device_get_memory_info(device, &memory), "nvmlDeviceGetMemoryInfo")) {
      sample.memory_used_mib = BytesToMiB(memory.used);
      sample.memory_free_mib = BytesToMiB(memory.free);
    }
  }
  if (reader.CanCall(s.device_get_temperature)) {
    unsigned int celsius = 0;
    if (reader.Ok(s.device_get_temperature(device, nvml::kTemperatureGpu, &celsius),
                  "nvmlDeviceGetTemperature")) {
      sample.temperature_c = static_cast<int32_t>(celsius);
    }
  }
  if (reader.CanCall(s.device_get_power_usage)) {
    unsigned int milliwatts = 0;
    if (reader.Ok(s.device_get_power_usage(device, &milliwatts), "nvmlDeviceGetPowerUsage")) {
      sample.power_w = milliwatts / 1000.0;
    }
  }
  if (reader.CanCall(s.device_get_clock_info)) {
    unsigned int mhz = 0;
    if (reader.Ok(s.device_get_clock_info(device, nvml::kClockSm, &mhz),
                  "nvmlDeviceGetClockInfo(SM)")) {
      sample.sm_clock_mhz = static_cast<int32_t>(mhz);
    }
  }
  if (reader.CanCall(s.device_get_clock_info)) {
    unsigned int mhz = 0;
    if (reader.Ok(s.device_get_clock_info(device, nvml::kClockMem, &mhz),
                  "nvmlDeviceGetClockInfo(MEM)")) {
      sample.memory_clock_mhz = static_cast<int32_t>(mhz);
    }
  }
  if (reader.CanCall(s.device_get_total_energy_consumption)) {
    unsigned long long millijoules = 0;
    if (reader.Ok(s.device_get_total_energy_consumption(device, &millijoules),
                  "nvmlDeviceGetTotalEnergyConsumption")) {
      sample.total_energy_mj = millijoules;
    }
  }
  if (reader.CanCall(s.device_get_total_ecc_errors)) {
    unsigned long long count = 0;
    if (reader.Ok(s.device_get_total_ecc_errors(device, nvml::kMemoryErrorCorrected,
                                                nvml::kVolatileEcc, &count),
                  "nvmlDeviceGetTotalEccErrors(corrected)")) {
      sample.ecc_single_bit_volatile = count;
    }
  }
  if (reader.CanCall(s.device_get_total_ecc_errors)) {
    unsigned long long count = 0;
    if (reader.Ok(s.device_get_total_ecc_errors(device, nvml::kMemoryErrorUncorrected,
                                                nvml::kVolatileEcc, &count),
                  "nvmlDeviceGetTotalEccErrors(uncorrected)")) {
      sample.ecc_double_bit_volatile = count;
    }
  }
  if (reader.CanCall(s.device_get_remapped_rows)) {
    unsigned int correctable = 0;
    unsigned int uncorrectable = 0;
    unsigned int pending = 0;
    unsigned int failure = 0;
    if (reader.Ok(
            s.device_get_remapped_rows(device, &correctable, &uncorrectable, &pending, &failure),
            "nvmlDeviceGetRemappedRows")) {
      sample.remapped_rows = RemappedRows{correctable, uncorrectable, pending != 0, failure != 0};
    }
  }
  if (reader.CanCall(s.device_get_throttle_reasons)) {
    unsigned long long reasons = 0;
    if (reader.Ok(s.device_get_throttle_reasons(device, &reasons),
                  "nvmlDeviceGetCurrentClocksThrottleReasons")) {
      sample.throttle_reasons = reasons;
    }
  }
  if (reader.CanCall(s.device_get_compute_running_processes_v3)) {
    // Ask, and ask again with more room while processes keep starting.
    std::vector<nvml::ProcessInfo> processes(32);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned int count = static_cast<unsigned int>(processes.size());
      const nvml::Return result =
          s.device_get_compute_running_processes_v3(device, &count, processes.data());
      if (result == nvml::kErrorInsufficientSize) {
        processes.resize(std::max<size_t>(count, processes.size()) + 16);
        continue;
      }
      if (reader.Ok(result, "nvmlDeviceGetComputeRunningProcesses_v3")) {
        std::vector<int32_t> pids;
        for (unsigned int i = 0; i < count && i < processes.size(); ++i) {
          pids.push_back(static_cast<int32_t>(processes[i].pid));
        }
        sample.process_ids = std::move(pids);
      }
      break;
    }
  }

  if (reader.lost()) {
    GpuSample lost;
    lost.time = now;
    lost.status = SampleStatus::kGpuLost;
    lost.error = reader.lost_message();
    return lost;
  }
  return sample;
}

std::vector<XidEvent> NvmlBackend::PollEvents(TimeMs now) {
  State& s = *state_;
  std::vector<XidEvent> events;
  if (s.event_set == nullptr) return events;
  std::lock_guard lock(s.events_mutex);
  // Bounded so that an event storm cannot stall the sampling thread.
  for (int i = 0; i < 256; ++i) {
    nvml::EventData data{};
    const nvml::Return result = s.event_set_wait(s.event_set, &data, 0);
    if (result != nvml::kSuccess) break;  // kErrorTimeout: nothing more queued
    if ((data.event_type & nvml::kEventTypeXidCriticalError) == 0) continue;
    // On a GPU in MIG mode: the instance it names, or all of them for the whole GPU's errors.
    if (auto parent =
            std::find_if(s.mig_parents.begin(), s.mig_parents.end(),
                         [&](const State::MigParent& p) { return p.device == data.device; });
        parent != s.mig_parents.end()) {
      for (size_t position : parent->instances) {
        const GpuInfo& instance = s.inventory.gpus[position];
        if (data.gpu_instance_id == nvml::kInvalidInstanceId ||
            data.gpu_instance_id == instance.mig->gpu_instance_id)
          events.push_back(XidEvent{instance.index, instance.uuid, data.event_data, now});
      }
      continue;
    }
    const auto handle = std::find(s.handles.begin(), s.handles.end(), data.device);
    if (handle == s.handles.end() || data.device == nullptr) continue;
    const auto index = static_cast<int32_t>(handle - s.handles.begin());
    const auto gpu = std::find_if(s.inventory.gpus.begin(), s.inventory.gpus.end(),
                                  [&](const GpuInfo& info) { return info.index == index; });
    if (gpu == s.inventory.gpus.end()) continue;
    events.push_back(XidEvent{index, gpu->uuid, data.event_data, now});
  }
  return events;
}

std::string GpuModelKey(std::string_view product_name, MiB memory_total_mib) {
  const std::vector<std::string_view> words = Words(product_name);
  for (const KnownGpuModel& model : KnownGpuModels()) {
    const bool family_matches = std::find(words.begin(), words.end(), model.family) != words.end();
    // Boards of one family differ in memory (A100 40 GB and 80 GB); within 5% is the same one.
    const bool memory_matches =
        std::abs(static_cast<double>(memory_total_mib - model.memory_mib)) <=
        0.05 * static_cast<double>(model.memory_mib);
    if (family_matches && memory_matches) return std::string(model.key);
  }
  std::string key;
  for (std::string_view word : words) {
    if (key.empty() && (word == "NVIDIA" || word == "Tesla")) continue;
    if (!key.empty()) key += '-';
    key += word;
  }
  return key.empty() ? std::string(product_name) : key;
}

}  // namespace gpufleet::agent
