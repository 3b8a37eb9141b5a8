#include "agent/gpu_health.h"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::agent {
namespace {

// From NVIDIA's XID catalogue; only the ones operators meet most often.
constexpr std::array<std::pair<uint64_t, std::string_view>, 20> kXidDescriptions{{
    {13, "graphics engine exception"},
    {31, "GPU memory page fault"},
    {43, "GPU stopped processing"},
    {45, "preemptive cleanup after previous errors"},
    {48, "double-bit ECC error"},
    {61, "internal micro-controller breakpoint/warning"},
    {62, "internal micro-controller halt"},
    {63, "ECC page retirement or row remapping recorded"},
    {64, "ECC page retirement or row remapping failed"},
    {68, "video processor exception"},
    {69, "graphics engine class error"},
    {74, "NVLink error"},
    {79, "GPU has fallen off the bus"},
    {92, "high single-bit ECC error rate"},
    {94, "contained ECC error"},
    {95, "uncontained ECC error"},
    {109, "context switch timeout"},
    {119, "GSP RPC timeout"},
    {120, "GSP error"},
    {154, "GPU recovery action changed"},
}};

std::string XidReason(uint64_t xid) {
  const std::string_view description = DescribeXid(xid);
  return description.empty() ? fmt::format("XID {}", xid)
                             : fmt::format("XID {}: {}", xid, description);
}

}  // namespace

std::string GpuHealth::Reason() const {
  std::string joined;
  for (const std::string& reason : reasons) {
    if (!joined.empty()) joined += "; ";
    joined += reason;
  }
  return joined;
}

std::string_view DescribeXid(uint64_t xid) {
  for (const auto& [code, description] : kXidDescriptions) {
    if (code == xid) return description;
  }
  return {};
}

GpuHealthTracker::GpuHealthTracker(GpuHealthConfig config) : config_(std::move(config)) {}

bool GpuHealthTracker::IsApplicationXid(uint64_t xid) const {
  return std::find(config_.application_xids.begin(), config_.application_xids.end(), xid) !=
         config_.application_xids.end();
}

GpuHealth GpuHealthTracker::Evaluate(const GpuInfo& gpu, const GpuSample& sample,
                                     std::span<const XidEvent> events) {
  Sticky& sticky = sticky_[gpu.uuid];
  for (const XidEvent& event : events) {
    if (event.uuid != gpu.uuid) continue;
    sticky.last_xid = event.xid;
    if (IsApplicationXid(event.xid)) continue;
    if (std::find(sticky.xids.begin(), sticky.xids.end(), event.xid) == sticky.xids.end()) {
      sticky.xids.push_back(event.xid);
    }
  }
  if (sample.ecc_double_bit_volatile) {
    sticky.double_bit_errors = std::max(sticky.double_bit_errors, *sample.ecc_double_bit_volatile);
  }

  GpuHealth health;
  health.last_xid = sticky.last_xid;
  switch (sample.status) {
    case SampleStatus::kOk:
      break;
    case SampleStatus::kGpuLost:
      health.reasons.push_back(fmt::format("GPU lost: {}", sample.error));
      break;
    case SampleStatus::kUnknownGpu:
    case SampleStatus::kFailed:
      health.reasons.push_back(fmt::format("cannot read the GPU: {}", sample.error));
      break;
  }
  for (uint64_t xid : sticky.xids)
    health.reasons.push_back(XidReason(xid));
  if (sticky.double_bit_errors > 0) {
    health.reasons.push_back(fmt::format("{} uncorrectable (double-bit) ECC error{}",
                                         sticky.double_bit_errors,
                                         sticky.double_bit_errors == 1 ? "" : "s"));
  }
  if (sample.remapped_rows) {
    if (sample.remapped_rows->failure) {
      health.reasons.push_back("row remapping failed: the memory has no spare rows left");
    }
    if (sample.remapped_rows->pending) {
      health.reasons.push_back("row remapping pending: the GPU needs a reset");
    }
  }
  if (sample.temperature_c && *sample.temperature_c > config_.max_temperature_c) {
    health.reasons.push_back(fmt::format("temperature {} C is over the {} C limit",
                                         *sample.temperature_c, config_.max_temperature_c));
  }
  health.healthy = health.reasons.empty();
  return health;
}

bool GpuHealthTracker::ClearSticky(std::string_view uuid) {
  const auto found = sticky_.find(uuid);
  if (found == sticky_.end()) return false;
  Sticky& sticky = found->second;
  const bool had_any = !sticky.xids.empty() || sticky.double_bit_errors > 0;
  sticky.xids.clear();
  sticky.double_bit_errors = 0;  // last_xid stays: it is history, not a verdict
  return had_any;
}

}  // namespace gpufleet::agent
