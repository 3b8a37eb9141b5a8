// Prometheus exposition: the exact text for a fixed state, dcgm-exporter's names and labels,
// omission of unsupported fields, label escaping, and a check that every line is valid 0.0.4.
#include "agent/gpu_metrics.h"

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/sim_gpu_backend.h"
#include "sim_gpu_test_util.h"

namespace gpufleet::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

GpuMetricsEntry BusyH100() {
  GpuMetricsEntry gpu;
  gpu.info.index = 0;
  gpu.info.uuid = "GPU-aaaa";
  gpu.info.product_name = "NVIDIA H100 80GB HBM3";
  gpu.info.model = "H100-80GB";
  gpu.info.pci_bus_id = "00000000:18:00.0";
  gpu.info.memory_total_mib = 81559;
  gpu.info.xid_events_supported = true;
  GpuSample& s = gpu.sample;
  s.utilization_percent = 87;
  s.memory_used_mib = 40000;
  s.memory_free_mib = 41559;
  s.temperature_c = 66;
  s.power_w = 612.5;
  s.sm_clock_mhz = 1980;
  s.memory_clock_mhz = 2619;
  s.total_energy_mj = 123456789;
  s.ecc_single_bit_volatile = 3;
  s.ecc_double_bit_volatile = 0;
  s.remapped_rows = RemappedRows{1, 0, false, false};
  s.throttle_reasons = 0;
  s.process_ids = std::vector<int32_t>{4242};
  gpu.health.last_xid = 13;
  gpu.job_ids = {"42"};
  return gpu;
}

GpuMetricsEntry LostH100() {
  GpuMetricsEntry gpu;
  gpu.info.index = 1;
  gpu.info.uuid = "GPU-bbbb";
  gpu.info.product_name = "NVIDIA H100 80GB HBM3";
  gpu.info.model = "H100-80GB";
  gpu.info.pci_bus_id = "00000000:2A:00.0";
  gpu.info.nvlink_island = 0;
  gpu.info.xid_events_supported = true;
  gpu.sample.status = SampleStatus::kGpuLost;
  gpu.sample.error = "GPU is lost";
  gpu.health.healthy = false;
  gpu.health.reasons = {"GPU lost: GPU is lost", "XID 79: GPU has fallen off the bus"};
  gpu.health.last_xid = 79;
  return gpu;
}

NodeMetricsSnapshot TwoGpuNode() {
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = "node-a";
  snapshot.backend = "nvml";
  snapshot.driver_version = "550.54.15";
  snapshot.gpus = {BusyH100(), LostH100()};
  return snapshot;
}

TEST(GpuMetricsTest, ExactTextForAFixedState) {
  const std::string a =
      R"(gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia0",)"
      R"(modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15")";
  const std::string b =
      R"(gpu="1",UUID="GPU-bbbb",pci_bus_id="00000000:2A:00.0",device="nvidia1",)"
      R"(modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15")";
  const std::string expected = fmt::format(
      R"(# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{a}}} 1980
# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).
# TYPE DCGM_FI_DEV_MEM_CLOCK gauge
DCGM_FI_DEV_MEM_CLOCK{{{a}}} 2619
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{a}}} 66
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{a}}} 612.5
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{a}}} 123456789
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{a}}} 87
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{a}}} 13
DCGM_FI_DEV_XID_ERRORS{{{b}}} 79
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{a}}} 41559
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{a}}} 40000
# HELP DCGM_FI_DEV_ECC_SBE_VOL_TOTAL Total number of single-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{a}}} 3
# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{a}}} 0
# HELP DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS Number of remapped rows for uncorrectable errors
# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{a}}} 0
# HELP DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS Number of remapped rows for correctable errors
# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{a}}} 1
# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge
DCGM_FI_DEV_ROW_REMAP_FAILURE{{{a}}} 0
# HELP DCGM_FI_DEV_ROW_REMAP_PENDING Whether remapping of rows is pending
# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge
DCGM_FI_DEV_ROW_REMAP_PENDING{{{a}}} 0
# HELP DCGM_FI_DEV_CLOCK_THROTTLE_REASONS Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{a}}} 0
# HELP gpufleet_gpu_info Always 1: the GPU's gpufleet model key and NVLink island.
# TYPE gpufleet_gpu_info gauge
gpufleet_gpu_info{{{a},model="H100-80GB",nvlink_island="0"}} 1
gpufleet_gpu_info{{{b},model="H100-80GB",nvlink_island="0"}} 1
# HELP gpufleet_gpu_healthy 1 when the GPU is healthy, 0 when not; reason says why not.
# TYPE gpufleet_gpu_healthy gauge
gpufleet_gpu_healthy{{{a},reason=""}} 1
gpufleet_gpu_healthy{{{b},reason="GPU lost: GPU is lost; XID 79: GPU has fallen off the bus"}} 0
# HELP gpufleet_gpu_job 1 for each job running on the GPU.
# TYPE gpufleet_gpu_job gauge
gpufleet_gpu_job{{{a},job_id="42"}} 1
# HELP gpufleet_agent_backend_info Always 1: the GPU backend in use (nvml or sim) and its driver version.
# TYPE gpufleet_agent_backend_info gauge
gpufleet_agent_backend_info{{Hostname="node-a",backend="nvml",driver_version="550.54.15"}} 1
)",
      fmt::arg("a", a), fmt::arg("b", b));
  EXPECT_EQ(RenderPrometheus(TwoGpuNode()), expected);
}

TEST(GpuMetricsTest, UnsupportedFieldsAreOmittedNotZero) {
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = "h";
  snapshot.backend = "nvml";
  GpuMetricsEntry gpu;
  gpu.info.uuid = "GPU-x";
  gpu.sample.temperature_c = 50;  // the only field this driver supports
  snapshot.gpus = {gpu};
  const std::string text = RenderPrometheus(snapshot);
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_TEMP{"));
  for (const char* absent :
       {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_SM_CLOCK",
        // no XID events on this GPU: no "last XID" either (0 would claim "none seen")
        "DCGM_FI_DEV_XID_ERRORS", "gpufleet_gpu_job"}) {
    EXPECT_THAT(text, Not(HasSubstr(absent))) << absent;
  }
}

TEST(GpuMetricsTest, BackendIsAlwaysExportedEvenWithoutGpus) {
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = "h";
  snapshot.backend = "sim";
  snapshot.driver_version = "sim-0.1.0";
  EXPECT_EQ(
      RenderPrometheus(snapshot),
      "# HELP gpufleet_agent_backend_info Always 1: the GPU backend in use (nvml or sim) "
      "and its driver version.\n"
      "# TYPE gpufleet_agent_backend_info gauge\n"
      "gpufleet_agent_backend_info{Hostname=\"h\",backend=\"sim\",driver_version=\"sim-0.1.0\"}"
      " 1\n");
}

TEST(GpuMetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(EscapeLabelValue(R"(plain)"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), R"(a\"b\\c\nd)");
  EXPECT_EQ(EscapeLabelValue("tab\tand unicode \xC3\xA9"), "tab\tand unicode \xC3\xA9");

  NodeMetricsSnapshot snapshot = TwoGpuNode();
  snapshot.hostname = "host \"quoted\"";
  snapshot.gpus[0].info.product_name = "Weird\\Name\nline2";
  snapshot.gpus[0].job_ids = {"job \"x\""};
  snapshot.gpus[1].health.reasons = {"a\nb"};
  const std::string text = RenderPrometheus(snapshot);
  EXPECT_THAT(text, HasSubstr(R"(modelName="Weird\\Name\nline2",Hostname="host \"quoted\"")"));
  EXPECT_THAT(text, HasSubstr(R"(,job_id="job \"x\""} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(reason="a\nb"} 0)"));
}

// A small parser of the text format: every line is a HELP, a TYPE or a sample; each family has
// one HELP and one TYPE before its samples, and all its samples are together; label values are
// properly quoted; values are numbers.
void ExpectValidExposition(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*",?)*)\} (-?[0-9]+(?:\.[0-9]+)?))");
  ASSERT_FALSE(text.empty());
  ASSERT_EQ(text.back(), '\n');
  std::set<std::string> finished;
  std::string current;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_match(line, match, kHelp)) {
      ASSERT_FALSE(finished.count(match[1])) << "family repeated: " << line;
      if (!current.empty()) finished.insert(current);
      current = match[1];
    } else if (std::regex_match(line, match, kType)) {
      ASSERT_EQ(match[1], current) << line;
    } else if (std::regex_match(line, match, kSample)) {
      ASSERT_EQ(match[1], current) << "sample outside its family: " << line;
    } else {
      ADD_FAILURE() << "not valid 0.0.4: " << line;
    }
  }
}

TEST(GpuMetricsTest, OutputIsValidTextFormat) {
  ExpectValidExposition(RenderPrometheus(TwoGpuNode()));
  NodeMetricsSnapshot escaped = TwoGpuNode();
  escaped.gpus[0].info.product_name = "Weird\\Name\n\"x\"";
  ExpectValidExposition(RenderPrometheus(escaped));
}

TEST(GpuMetricsTest, AppendReusesTheBuffer) {
  std::string buffer = "# previous\n";
  AppendPrometheus(TwoGpuNode(), buffer);
  EXPECT_EQ(buffer, "# previous\n" + RenderPrometheus(TwoGpuNode()));
}

// A fixed simulator state, rendered end to end.
TEST(GpuMetricsTest, ExactLinesForASimulatedNode) {
  SimGpuBackend backend(ParseSimGpuSpec("2xH100-80GB"), Options("node-a"));
  backend.AdvanceTo(0);
  ASSERT_EQ(backend.SetLoad(0, Load(0.5, 1000, {7})), std::nullopt);
  backend.Advance(60 * kSecond);
  ASSERT_EQ(backend.InjectXid(1, 48), std::nullopt);

  const GpuInventory inventory = backend.Discover();
  GpuHealthTracker tracker;
  const std::vector<XidEvent> events = backend.PollEvents(60 * kSecond);
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = "node-a";
  snapshot.backend = std::string(backend.Name());
  snapshot.driver_version = backend.DriverVersion();
  for (const GpuInfo& info : inventory.gpus) {
    GpuMetricsEntry entry;
    entry.info = info;
    entry.sample = backend.Sample(info.index, 60 * kSecond);
    entry.health = tracker.Evaluate(info, entry.sample, events);
    if (info.index == 0) entry.job_ids = {"1001"};
    snapshot.gpus.push_back(std::move(entry));
  }
  const std::string text = RenderPrometheus(snapshot);
  ExpectValidExposition(text);

  const auto labels = [&](int index) {
    const GpuInfo& info = inventory.gpus[static_cast<size_t>(index)];
    return fmt::format(
        R"(gpu="{}",UUID="{}",pci_bus_id="{}",device="nvidia{}",modelName="NVIDIA H100 80GB HBM3",)"
        R"(Hostname="node-a",DCGM_FI_DRIVER_VERSION="{}")",
        index, info.uuid, info.pci_bus_id, index, backend.DriverVersion());
  };
  const std::string gpu0 = labels(0);
  const std::string gpu1 = labels(1);
  for (const std::string& line : {
           // 70 W + (700 - 70) W * 0.5; idle: 70 W
           "DCGM_FI_DEV_POWER_USAGE{" + gpu0 + "} 385",
           "DCGM_FI_DEV_POWER_USAGE{" + gpu1 + "} 70",
           // 385 W and 70 W for 60 s, in mJ
           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" + gpu0 + "} 23100000",
           "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" + gpu1 + "} 4200000",
           // 53.1 C target from 34.2 C after two time constants: 50.54 C
           "DCGM_FI_DEV_GPU_TEMP{" + gpu0 + "} 51",
           "DCGM_FI_DEV_GPU_TEMP{" + gpu1 + "} 34",
           "DCGM_FI_DEV_FB_USED{" + gpu0 + "} 1000",
           "DCGM_FI_DEV_FB_FREE{" + gpu0 + "} 80559",
           "DCGM_FI_DEV_SM_CLOCK{" + gpu0 + "} 1980",
           "DCGM_FI_DEV_SM_CLOCK{" + gpu1 + "} 345",
           "DCGM_FI_DEV_XID_ERRORS{" + gpu0 + "} 0",
           "DCGM_FI_DEV_XID_ERRORS{" + gpu1 + "} 48",
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{" + gpu1 + "} 1",
           "gpufleet_gpu_healthy{" + gpu0 + ",reason=\"\"} 1",
           "gpufleet_gpu_healthy{" + gpu1 + ",reason=\"XID 48: double-bit ECC error\"} 0",
           "gpufleet_gpu_job{" + gpu0 + ",job_id=\"1001\"} 1",
           "gpufleet_agent_backend_info{Hostname=\"node-a\",backend=\"sim\",driver_version=\"" +
               backend.DriverVersion() + "\"} 1",
       }) {
    EXPECT_THAT(text, HasSubstr("\n" + line + "\n")) << line;
  }
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "\nDCGM_FI_DEV_GPU_UTIL\\{gpu=\"0\"[^}]*\\} (48|49|50|51|52)\n"));
}

}  // namespace
}  // namespace gpufleet::agent
