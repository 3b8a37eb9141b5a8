#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/gpu_backend.h"

namespace gpufleet::agent {

struct GpuHealthConfig {
  // Above this the GPU is unhealthy (most data-centre GPUs start slowing down around 87-90 C).
  int32_t max_temperature_c = 90;
  // XIDs caused by the application (a bad kernel, a fault in user code), not by the GPU: they
  // are exported but do not make the GPU unhealthy.
  std::vector<uint64_t> application_xids = {13, 31, 43, 45, 68, 109};
};

struct GpuHealth {
  bool healthy = true;
  std::vector<std::string> reasons;  // why not, one per problem; empty when healthy
  std::optional<uint64_t> last_xid;  // the latest XID of any kind (DCGM_FI_DEV_XID_ERRORS)

  // The reasons joined with "; ".
  std::string Reason() const;
};

// A short description of well-known XIDs ("GPU has fallen off the bus"), or "" when unknown.
std::string_view DescribeXid(uint64_t xid);

// Turns samples and XID events into a verdict per GPU. XIDs and double-bit ECC errors are
// sticky: the GPU stays unhealthy until ClearSticky (after a reset or repair), since both mean
// its memory or state can no longer be trusted even when the next sample looks fine. The other
// conditions (row remap pending or failed, GPU lost, too hot) follow the latest sample.
// Not thread-safe: the sampling thread owns it.
class GpuHealthTracker {
 public:
  explicit GpuHealthTracker(GpuHealthConfig config = {});

  // `events` may hold other GPUs' events; only those for `gpu` (by UUID) count.
  GpuHealth Evaluate(const GpuInfo& gpu, const GpuSample& sample, std::span<const XidEvent> events);
  // Forgets the sticky problems of one GPU; returns whether it had any.
  bool ClearSticky(std::string_view uuid);

  bool IsApplicationXid(uint64_t xid) const;

 private:
  struct Sticky {
    std::vector<uint64_t> xids;  // distinct hardware XIDs, in order of first occurrence
    uint64_t double_bit_errors = 0;
    std::optional<uint64_t> last_xid;
  };

  GpuHealthConfig config_;
  std::map<std::string, Sticky, std::less<>> sticky_;
};

}  // namespace gpufleet::agent
