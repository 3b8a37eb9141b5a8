#include "agent/gpu_metrics.h"

#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <variant>

#include <fmt/format.h>

namespace gpufleet::agent {
namespace {

// Integers print as integers; power is the only fractional value.
using Value = std::variant<int64_t, double>;

template <typename T>
std::optional<Value> IntegerOf(const std::optional<T>& field) {
  if (!field) return std::nullopt;
  return Value{static_cast<int64_t>(*field)};
}

struct Family {
  std::string_view name;
  std::string_view type;
  std::string_view help;
  std::optional<Value> (*value)(const GpuMetricsEntry&);
};

// dcgm-exporter's names, types and help texts (etc/default-counters.csv), in its order.
constexpr std::array<Family, 16> kDcgmFamilies{{
    {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.sm_clock_mhz); }},
    {"DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.memory_clock_mhz); }},
    {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.temperature_c); }},
    {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       if (!gpu.sample.power_w) return std::nullopt;
       return Value{*gpu.sample.power_w};
     }},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.total_energy_mj); }},
    {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.utilization_percent); }},
    {"DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       // 0 means "none yet", as in dcgm-exporter; without XID events there is no value at all.
       if (!gpu.info.xid_events_supported) return std::nullopt;
       return Value{static_cast<int64_t>(gpu.health.last_xid.value_or(0))};
     }},
    {"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.memory_free_mib); }},
    {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.memory_used_mib); }},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.ecc_single_bit_volatile); }},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.ecc_double_bit_volatile); }},
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       if (!gpu.sample.remapped_rows) return std::nullopt;
       return Value{int64_t{gpu.sample.remapped_rows->uncorrectable}};
     }},
    {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       if (!gpu.sample.remapped_rows) return std::nullopt;
       return Value{int64_t{gpu.sample.remapped_rows->correctable}};
     }},
    {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       if (!gpu.sample.remapped_rows) return std::nullopt;
       return Value{int64_t{gpu.sample.remapped_rows->failure ? 1 : 0}};
     }},
    {"DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
     [](const GpuMetricsEntry& gpu) -> std::optional<Value> {
       if (!gpu.sample.remapped_rows) return std::nullopt;
       return Value{int64_t{gpu.sample.remapped_rows->pending ? 1 : 0}};
     }},
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
     "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
     [](const GpuMetricsEntry& gpu) { return IntegerOf(gpu.sample.throttle_reasons); }},
}};

using Out = std::back_insert_iterator<std::string>;

void AppendEscaped(std::string_view value, std::string& out) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

void AppendLabel(std::string_view name, std::string_view value, std::string& out) {
  if (!out.empty() && out.back() != '{') out += ',';
  out += name;
  out += "=\"";
  AppendEscaped(value, out);
  out += '"';
}

// dcgm-exporter's label set for one GPU, without braces. The device label is the index: NVML
// numbers /dev/nvidiaN the same way on every machine gpufleet supports.
std::string GpuLabels(const NodeMetricsSnapshot& snapshot, const GpuMetricsEntry& gpu) {
  std::string labels = "{";
  AppendLabel("gpu", fmt::format("{}", gpu.info.index), labels);
  AppendLabel("UUID", gpu.info.uuid, labels);
  AppendLabel("pci_bus_id", gpu.info.pci_bus_id, labels);
  const auto& mig = gpu.info.mig;
  AppendLabel("device", fmt::format("nvidia{}", mig ? mig->parent_index : gpu.info.index), labels);
  // dcgm-exporter's names for a MIG instance.
  if (mig) {
    AppendLabel("GPU_I_PROFILE", mig->profile, labels);
    AppendLabel("GPU_I_ID", fmt::format("{}", mig->gpu_instance_id), labels);
  }
  AppendLabel("modelName", gpu.info.product_name, labels);
  AppendLabel("Hostname", snapshot.hostname, labels);
  AppendLabel("DCGM_FI_DRIVER_VERSION", snapshot.driver_version, labels);
  return labels.substr(1);
}

void AppendHeader(std::string_view name, std::string_view type, std::string_view help,
                  std::string& out) {
  fmt::format_to(Out(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void AppendValue(const Value& value, std::string& out) {
  if (const auto* integer = std::get_if<int64_t>(&value)) {
    fmt::format_to(Out(out), "{}", *integer);
  } else {
    fmt::format_to(Out(out), "{}", std::get<double>(value));
  }
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  AppendEscaped(value, escaped);
  return escaped;
}

void AppendPrometheus(const NodeMetricsSnapshot& snapshot, std::string& out) {
  std::vector<std::string> labels;
  labels.reserve(snapshot.gpus.size());
  for (const GpuMetricsEntry& gpu : snapshot.gpus)
    labels.push_back(GpuLabels(snapshot, gpu));

  for (const Family& family : kDcgmFamilies) {
    bool header_written = false;
    for (size_t i = 0; i < snapshot.gpus.size(); ++i) {
      const std::optional<Value> value = family.value(snapshot.gpus[i]);
      if (!value) continue;  // not supported on this GPU: no line rather than a false 0
      if (!header_written) {
        AppendHeader(family.name, family.type, family.help, out);
        header_written = true;
      }
      fmt::format_to(Out(out), "{}{{{}}} ", family.name, labels[i]);
      AppendValue(*value, out);
      out += '\n';
    }
  }

  if (!snapshot.gpus.empty()) {
    AppendHeader("gpufleet_gpu_info", "gauge",
                 "Always 1: the GPU's gpufleet model key and NVLink island.", out);
    for (size_t i = 0; i < snapshot.gpus.size(); ++i) {
      const GpuInfo& info = snapshot.gpus[i].info;
      fmt::format_to(Out(out), "gpufleet_gpu_info{{{},model=\"", labels[i]);
      AppendEscaped(info.model, out);
      fmt::format_to(Out(out), "\",nvlink_island=\"{}\"}} 1\n", info.nvlink_island);
    }
    AppendHeader("gpufleet_gpu_healthy", "gauge",
                 "1 when the GPU is healthy, 0 when not; reason says why not.", out);
    for (size_t i = 0; i < snapshot.gpus.size(); ++i) {
      const GpuHealth& health = snapshot.gpus[i].health;
      fmt::format_to(Out(out), "gpufleet_gpu_healthy{{{},reason=\"", labels[i]);
      AppendEscaped(health.Reason(), out);
      fmt::format_to(Out(out), "\"}} {}\n", health.healthy ? 1 : 0);
    }
  }
  bool jobs_header_written = false;
  for (size_t i = 0; i < snapshot.gpus.size(); ++i) {
    for (const std::string& job : snapshot.gpus[i].job_ids) {
      if (!jobs_header_written) {
        AppendHeader("gpufleet_gpu_job", "gauge", "1 for each job running on the GPU.", out);
        jobs_header_written = true;
      }
      // Not `job`: Prometheus renames a scraped `job` label to `exported_job` (it is the
      // target's label), so the job id has a name of its own.
      fmt::format_to(Out(out), "gpufleet_gpu_job{{{},job_id=\"", labels[i]);
      AppendEscaped(job, out);
      out += "\"} 1\n";
    }
  }
  bool shares_header_written = false;
  for (size_t i = 0; i < snapshot.gpus.size(); ++i) {
    for (const GpuMetricsEntry::Share& share : snapshot.gpus[i].shares) {
      if (!shares_header_written) {
        AppendHeader("gpufleet_gpu_share_limit", "gauge",
                     "Limits of each job's share of a GPU: compute_percent of its SMs, "
                     "memory_mib of its memory; sharing says what enforces them (mps) or not "
                     "(recorded on simulated GPUs, advisory).",
                     out);
        shares_header_written = true;
      }
      for (const auto& [limit, value] :
           {std::pair<const char*, int64_t>{"compute_percent", share.compute_percent},
            std::pair<const char*, int64_t>{"memory_mib", share.memory_limit_mib}}) {
        fmt::format_to(Out(out), "gpufleet_gpu_share_limit{{{},job_id=\"", labels[i]);
        AppendEscaped(share.job_id, out);
        fmt::format_to(Out(out), "\",limit=\"{}\",sharing=\"", limit);
        AppendEscaped(snapshot.gpu_sharing, out);
        fmt::format_to(Out(out), "\"}} {}\n", value);
      }
    }
  }
  AppendHeader("gpufleet_agent_backend_info", "gauge",
               "Always 1: the GPU backend in use (nvml or sim) and its driver version.", out);
  std::string info_labels = "{";
  AppendLabel("Hostname", snapshot.hostname, info_labels);
  AppendLabel("backend", snapshot.backend, info_labels);
  AppendLabel("driver_version", snapshot.driver_version, info_labels);
  fmt::format_to(Out(out), "gpufleet_agent_backend_info{}}} 1\n", info_labels);
}

std::string RenderPrometheus(const NodeMetricsSnapshot& snapshot) {
  std::string out;
  out.reserve(1024 + snapshot.gpus.size() * 4096);
  AppendPrometheus(snapshot, out);
  return out;
}

}  // namespace gpufleet::agent
