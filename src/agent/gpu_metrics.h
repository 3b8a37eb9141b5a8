#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "agent/gpu_backend.h"
#include "agent/gpu_health.h"

namespace gpufleet::agent {

// What /metrics shows for one GPU: the latest sample and verdict, and the jobs on it.
struct GpuMetricsEntry {
  GpuInfo info;
  GpuSample sample;
  GpuHealth health;
  std::vector<std::string> job_ids;  // several when the GPU is shared
  // The limits of each share of the GPU (none when it is held whole).
  struct Share {
    std::string job_id;
    int compute_percent = 0;
    MiB memory_limit_mib = 0;
  };
  std::vector<Share> shares;
};

struct NodeMetricsSnapshot {
  std::string hostname;        // the Hostname label
  std::string gpu_sharing;     // the sharing label of share limits: "mps", "recorded", ...
  std::string backend;         // GpuBackend::Name(): "nvml" or "sim"
  std::string driver_version;  // the DCGM_FI_DRIVER_VERSION label
  std::vector<GpuMetricsEntry> gpus;
};

// The content type of what RenderPrometheus returns.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Prometheus text exposition format 0.0.4 with dcgm-exporter's metric names, types and labels
// (gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION), so existing
// Grafana dashboards work, plus gpufleet's own: gpufleet_gpu_healthy, gpufleet_gpu_job and
// gpufleet_agent_backend_info. Fields a GPU does not support are left out, never shown as 0.
std::string RenderPrometheus(const NodeMetricsSnapshot& snapshot);
// The same, appended to `out` (reuse one buffer to avoid allocating on every scrape).
void AppendPrometheus(const NodeMetricsSnapshot& snapshot, std::string& out);

// Escapes a label value: backslash, double quote and line feed, as the format requires.
std::string EscapeLabelValue(std::string_view value);

}  // namespace gpufleet::agent
