// The CLI's job YAML reader and then the API's decoder, as `gpufleet submit -f job.yaml` runs
// them: any file gives a job or a message naming the line.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/json.h"
#include "cli/job_commands.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string error;
  std::map<std::string, int> lines;
  auto json = gpufleet::cli::JobYamlToJson(text, "job.yaml", error, &lines);
  if (json) gpufleet::api::ParseJobSubmission(*json, error);
  return 0;
}
