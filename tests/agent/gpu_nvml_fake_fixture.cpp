// TEST FIXTURE ONLY: a stand-in for libnvidia-ml.so.1 that gpu_nvml_backend_test loads by path
// to prove symbol resolution, the fallbacks for missing symbols and the plumbing of values. It is
// built as gpufleet_test_fake_nvml (never under the driver's file name) and nothing in src/ may
// load it. Its declarations are written independently of src/agent/nvml_backend.cpp, from NVML's
// public header, so a layout mistake there shows up as wrong values in the test.
//
// Built twice: in full, and with GPUFLEET_FAKE_NVML_MINIMAL, which exports only the functions the
// backend requires plus nvmlDeviceGetMemoryInfo (v1) and nvmlDeviceGetTemperature, like an old
// or stripped-down driver.
//
// Five GPUs: 0 and 1 joined by a direct NVLink, 2 and 3 joined through two NVSwitches, 4 without
// NVLink (an L40S). Control functions (gpufleet_fake_nvml_*) let the test inject faults.
//
// MIG: one H100 may be put in MIG mode (gpufleet_fake_nvml_set_mig_gpu, or the environment's
// GPUFLEET_FAKE_NVML_MIG_GPU for tests through the real agent). It then holds two instances, a
// 3g.40gb in slot 0 (GPU instance 1) and a 1g.10gb in slot 2 (GPU instance 9), slot 1 empty.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using nvmlReturn = unsigned int;
constexpr nvmlReturn kSuccess = 0;
constexpr nvmlReturn kInvalidArgument = 2;
constexpr nvmlReturn kNotSupported = 3;
constexpr nvmlReturn kNoPermission = 4;
constexpr nvmlReturn kNotFound = 6;
constexpr nvmlReturn kInsufficientSize = 7;
constexpr nvmlReturn kTimeout = 10;
constexpr nvmlReturn kGpuIsLost = 15;
constexpr nvmlReturn kArgumentVersionMismatch = 25;

struct FakeGpu {
  int index;
};
FakeGpu fake_gpus[5] = {{0}, {1}, {2}, {3}, {4}};
constexpr unsigned int kGpuCount = 5;
constexpr unsigned int kLinksPerGpu = 4;

struct FakeMig {
  unsigned int slot;
  unsigned int gpu_instance;
  const char* profile;
  unsigned long long memory_mib;
};
constexpr FakeMig kMigs[2] = {{0, 1, "3g.40gb", 40192}, {2, 9, "1g.10gb", 9856}};
FakeGpu mig_handles[2] = {{100}, {101}};
int mig_gpu = -1;  // the GPU in MIG mode; -1: none

struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
static_assert(sizeof(PciInfo) == 68);

struct MemoryV1 {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct MemoryV2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(MemoryV2) == 40);

struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};

struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(ProcessInfo) == 24);

struct EventData {
  FakeGpu* device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(EventData) == 32);

struct FakeEvent {
  unsigned int gpu;
  unsigned long long xid;
  unsigned int gpu_instance;
};

nvmlReturn init_result = kSuccess;
bool lost[kGpuCount] = {};
std::deque<FakeEvent> events;
[[maybe_unused]] int event_set_token = 0;

int IndexOf(const FakeGpu* device) {
  for (unsigned int i = 0; i < kGpuCount; ++i) {
    if (device == &fake_gpus[i]) return static_cast<int>(i);
  }
  return -1;
}

// The MIG instance a handle is, or nullptr.
[[maybe_unused]] const FakeMig* MigOf(const FakeGpu* device) {
  for (int i = 0; i < 2; ++i)
    if (mig_gpu >= 0 && device == &mig_handles[i]) return &kMigs[i];
  return nullptr;
}

// Common checks: a valid handle of a GPU that is still there. A MIG instance supports only what
// answers for it explicitly.
nvmlReturn Check(const FakeGpu* device) {
  const int index = IndexOf(device);
  if (index < 0) return MigOf(device) != nullptr ? kNotSupported : kInvalidArgument;
  return lost[index] ? kGpuIsLost : kSuccess;
}

unsigned long long MemoryBytes(int index) {
  return (index == 4 ? 46068ULL : 81559ULL) << 20;
}

[[maybe_unused]] void FillPci(unsigned int domain, unsigned int bus, PciInfo* pci) {
  std::memset(pci, 0, sizeof(*pci));
  pci->domain = domain;
  pci->bus = bus;
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:00.0", domain, bus);
  std::snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:00.0", domain, bus);
}

[[maybe_unused]] unsigned int GpuBus(int index) {
  return 0x18 + 0x10 * static_cast<unsigned int>(index);
}

}  // namespace

// --- control, for the test only -----------------------------------------------------------------

FAKE_EXPORT void gpufleet_fake_nvml_reset() {
  init_result = kSuccess;
  for (bool& gpu_lost : lost)
    gpu_lost = false;
  events.clear();
  mig_gpu = -1;
}
FAKE_EXPORT void gpufleet_fake_nvml_set_mig_gpu(int gpu) {
  mig_gpu = gpu;
}
FAKE_EXPORT void gpufleet_fake_nvml_push_mig_xid(unsigned int gpu, unsigned int gpu_instance,
                                                 unsigned long long xid) {
  events.push_back({gpu, xid, gpu_instance});
}
FAKE_EXPORT void gpufleet_fake_nvml_set_init_result(unsigned int result) {
  init_result = result;
}
FAKE_EXPORT void gpufleet_fake_nvml_set_lost(unsigned int gpu) {
  lost[gpu] = true;
}
FAKE_EXPORT void gpufleet_fake_nvml_push_xid(unsigned int gpu, unsigned long long xid) {
  events.push_back({gpu, xid, 0xFFFFFFFF});
}

// --- NVML: the functions every build exports ----------------------------------------------------

FAKE_EXPORT nvmlReturn nvmlInit_v2() {
  if (const char* gpu = std::getenv("GPUFLEET_FAKE_NVML_MIG_GPU")) mig_gpu = std::atoi(gpu);
  return init_result;
}
FAKE_EXPORT nvmlReturn nvmlShutdown() {
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = kGpuCount;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetHandleByIndex_v2(unsigned int index, FakeGpu** device) {
  if (index >= kGpuCount) return kInvalidArgument;
  *device = &fake_gpus[index];
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetUUID(FakeGpu* device, char* uuid, unsigned int length) {
  if (const FakeMig* mig = MigOf(device)) {
    std::snprintf(uuid, length, "MIG-11111111-2222-3333-4444-00000000000%u", mig->slot);
    return kSuccess;
  }
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  std::snprintf(uuid, length, "GPU-00000000-1111-2222-3333-00000000000%d", IndexOf(device));
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetTemperature(FakeGpu* device, unsigned int sensor,
                                                unsigned int* celsius) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (sensor != 0) return kInvalidArgument;  // only NVML_TEMPERATURE_GPU
  *celsius = 40 + static_cast<unsigned int>(IndexOf(device));
  return kSuccess;
}

#ifdef GPUFLEET_FAKE_NVML_MINIMAL

FAKE_EXPORT nvmlReturn nvmlDeviceGetMemoryInfo(FakeGpu* device, MemoryV1* memory) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  memory->total = MemoryBytes(IndexOf(device));
  memory->used = 1024ULL << 20;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

#else  // the full build

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn result) {
  switch (result) {
    case kNoPermission:
      return "Insufficient Permissions";
    case kGpuIsLost:
      return "GPU is lost";
    case 9:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}
FAKE_EXPORT nvmlReturn nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  std::snprintf(version, length, "550.54.15");
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetName(FakeGpu* device, char* name, unsigned int length) {
  if (const FakeMig* mig = MigOf(device)) {
    std::snprintf(name, length, "NVIDIA H100 80GB HBM3 MIG %s", mig->profile);
    return kSuccess;
  }
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  std::snprintf(name, length, "%s", IndexOf(device) == 4 ? "NVIDIA L40S" : "NVIDIA H100 80GB HBM3");
  return kSuccess;
}
// Minors that differ from the indices (as after a GPU was pulled), so a backend that names
// device files by index shows up: GPU i is /dev/nvidia(i + 1) mod 5.
FAKE_EXPORT nvmlReturn nvmlDeviceGetMinorNumber(FakeGpu* device, unsigned int* minor) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *minor = static_cast<unsigned int>(IndexOf(device) + 1) % kGpuCount;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetPciInfo_v3(FakeGpu* device, PciInfo* pci) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  FillPci(0, GpuBus(IndexOf(device)), pci);
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetMemoryInfo_v2(FakeGpu* device, MemoryV2* memory) {
  if (memory->version != (sizeof(MemoryV2) | (2U << 24))) return kArgumentVersionMismatch;
  if (const FakeMig* mig = MigOf(device)) {
    memory->total = mig->memory_mib << 20;
    memory->reserved = 0;
    memory->used = 13ULL << 20;
    memory->free = memory->total - memory->used;
    return kSuccess;
  }
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  memory->total = MemoryBytes(IndexOf(device));
  memory->reserved = 512ULL << 20;
  memory->used = (2048ULL + static_cast<unsigned long long>(IndexOf(device))) << 20;
  memory->free = memory->total - memory->reserved - memory->used;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetUtilizationRates(FakeGpu* device, Utilization* utilization) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  utilization->gpu = 10 * static_cast<unsigned int>(IndexOf(device)) + 5;
  utilization->memory = 1;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetPowerUsage(FakeGpu* device, unsigned int* milliwatts) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *milliwatts = 123456 + static_cast<unsigned int>(IndexOf(device));
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetEnforcedPowerLimit(FakeGpu* device, unsigned int* milliwatts) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *milliwatts = IndexOf(device) == 4 ? 350000 : 700000;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetClockInfo(FakeGpu* device, unsigned int type,
                                              unsigned int* mhz) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (type == 1) {  // NVML_CLOCK_SM
    *mhz = 1980;
  } else if (type == 2) {  // NVML_CLOCK_MEM
    *mhz = 2619;
  } else {
    return kInvalidArgument;
  }
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetTotalEnergyConsumption(FakeGpu* device,
                                                           unsigned long long* millijoules) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (IndexOf(device) == 4) return kNoPermission;  // a failure that is not "not supported"
  *millijoules = 1'000'000'000ULL + static_cast<unsigned long long>(IndexOf(device));
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetTotalEccErrors(FakeGpu* device, unsigned int error_type,
                                                   unsigned int counter_type,
                                                   unsigned long long* count) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (IndexOf(device) == 3) return kNotSupported;  // ECC disabled on this one
  if (counter_type != 0) return kInvalidArgument;  // only NVML_VOLATILE_ECC is expected
  // corrected (0): 7 + index; uncorrected (1): 0
  *count = error_type == 0 ? 7 + static_cast<unsigned long long>(IndexOf(device)) : 0;
  return error_type <= 1 ? kSuccess : kInvalidArgument;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetRemappedRows(FakeGpu* device, unsigned int* correctable,
                                                 unsigned int* uncorrectable, unsigned int* pending,
                                                 unsigned int* failure) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *correctable = 1;
  *uncorrectable = 2;
  *pending = IndexOf(device) == 1 ? 1 : 0;
  *failure = 0;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetCurrentClocksThrottleReasons(FakeGpu* device,
                                                                 unsigned long long* reasons) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *reasons = IndexOf(device) == 0 ? 0x1 : 0x4;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetComputeRunningProcesses_v3(FakeGpu* device, unsigned int* count,
                                                               ProcessInfo* processes) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  // GPU 0 runs more processes than a first guess of 32 holds, to exercise the retry.
  const unsigned int running =
      IndexOf(device) == 0 ? 40 : static_cast<unsigned int>(IndexOf(device));
  if (*count < running) {
    *count = running;
    return kInsufficientSize;
  }
  for (unsigned int i = 0; i < running; ++i) {
    processes[i] = ProcessInfo{1000 + i, 1ULL << 30, 0xFFFFFFFF, 0xFFFFFFFF};
  }
  *count = running;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetNvLinkState(FakeGpu* device, unsigned int link,
                                                unsigned int* active) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  const int index = IndexOf(device);
  if (index == 4) return kNotSupported;
  if (link >= kLinksPerGpu) return kInvalidArgument;
  // 0 and 1: link 0 only; 2 and 3: links 0 and 1, one to each switch.
  *active = (index <= 1 ? link == 0 : link <= 1) ? 1 : 0;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetNvLinkRemotePciInfo_v2(FakeGpu* device, unsigned int link,
                                                           PciInfo* pci) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  const int index = IndexOf(device);
  if (index <= 1) {
    FillPci(0, GpuBus(1 - index), pci);  // the other GPU of the pair
  } else {
    FillPci(0, 0xE0 + link, pci);  // NVSwitch 0 or 1
  }
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlEventSetCreate(int** set) {
  *set = &event_set_token;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceRegisterEvents(FakeGpu* device, unsigned long long types,
                                                int* set) {
  if (set != &event_set_token) return kInvalidArgument;
  if (types != 0x8) return kInvalidArgument;  // the backend registers for XIDs only
  return Check(device);
}
FAKE_EXPORT nvmlReturn nvmlEventSetWait_v2(int* set, EventData* data, unsigned int timeout_ms) {
  if (set != &event_set_token || timeout_ms != 0) return kInvalidArgument;
  if (events.empty()) return kTimeout;
  const FakeEvent event = events.front();
  events.pop_front();
  data->device = &fake_gpus[event.gpu];
  data->eventType = 0x8;
  data->eventData = event.xid;
  data->gpuInstanceId = event.gpu_instance;
  data->computeInstanceId = 0xFFFFFFFF;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetMigMode(FakeGpu* device, unsigned int* current,
                                            unsigned int* pending) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (IndexOf(device) == 4) return kNotSupported;  // the L40S has no MIG
  *current = *pending = IndexOf(device) == mig_gpu ? 1 : 0;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetMaxMigDeviceCount(FakeGpu* device, unsigned int* count) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  *count = IndexOf(device) == 4 ? 0 : 7;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetMigDeviceHandleByIndex(FakeGpu* device, unsigned int index,
                                                           FakeGpu** mig) {
  if (const nvmlReturn result = Check(device); result != kSuccess) return result;
  if (IndexOf(device) != mig_gpu) return kInvalidArgument;  // not in MIG mode
  for (int i = 0; i < 2; ++i) {
    if (kMigs[i].slot == index) {
      *mig = &mig_handles[i];
      return kSuccess;
    }
  }
  return kNotFound;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetGpuInstanceId(FakeGpu* device, unsigned int* id) {
  const FakeMig* mig = MigOf(device);
  if (mig == nullptr) return kInvalidArgument;
  *id = mig->gpu_instance;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlDeviceGetComputeInstanceId(FakeGpu* device, unsigned int* id) {
  if (MigOf(device) == nullptr) return kInvalidArgument;
  *id = 0;
  return kSuccess;
}
FAKE_EXPORT nvmlReturn nvmlEventSetFree(int* set) {
  return set == &event_set_token ? kSuccess : kInvalidArgument;
}

#endif
