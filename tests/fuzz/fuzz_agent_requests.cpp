// The agent's request decoders (launch, fault) and the state files its shims write and it reads
// back after a restart: a damaged file must be an error, not a crash.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "agent/agent_api.h"
#include "agent/executor_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace files = gpufleet::agent::executor_internal;
  const std::string text(reinterpret_cast<const char*>(data), size);
  gpufleet::agent::ParseLaunchRequest(text);
  gpufleet::agent::ParseFaultRequest(text);
  files::ShimSpec spec;
  files::ParseShimSpec(text, spec);
  files::ProcessRecord record;
  files::ParseProcessRecord(text, record);
  files::FinalStatus status;
  files::ParseFinalStatus(text, status);
  files::CancelRequest cancel;
  files::ParseCancelRequest(text, cancel);
  return 0;
}
