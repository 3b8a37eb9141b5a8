// The API's JSON decoders: a job submission and a deployment spec, as the server reads request
// bodies. Any input must give a value or an error, never a crash or an exception.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string error;
  gpufleet::api::ParseJobSubmissionText(text, error);
  gpufleet::api::ParseDeploymentSpecText(text, error);
  return 0;
}
