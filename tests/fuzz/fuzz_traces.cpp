// Every trace reader of `gpufleet sim`, and the queue YAML: a malformed file must be a
// TraceError/QueuesError naming the line (or a YAML error), never a crash.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include "sim/queues.h"
#include "sim/request_traces.h"
#include "sim/trace_readers.h"

namespace {

// The readers take paths: the input goes to one private file, rewritten each time.
const std::string& InputPath() {
  static const std::string path = [] {
    char name[] = "/tmp/gpufleet-fuzz-trace-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd >= 0) ::close(fd);
    return std::string(name);
  }();
  return path;
}

template <typename Read>
void Expect(Read read) {
  try {
    read();
  } catch (const gpufleet::sim::TraceError&) {
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sim = gpufleet::sim;
  const std::string& path = InputPath();
  if (FILE* file = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, file);
    std::fclose(file);
  }
  for (sim::TraceFormat format : {sim::TraceFormat::kItp, sim::TraceFormat::kPhilly,
                                  sim::TraceFormat::kAlibabaPods, sim::TraceFormat::kGeneric})
    for (bool skip : {false, true})
      Expect([&] { sim::ReadTrace(path, format, {.skip_invalid = skip}); });
  Expect([&] { sim::ReadTrace(path); });
  Expect([&] { sim::ReadAlibabaNodes(path, 4, 2); });
  for (bool skip : {false, true}) {
    Expect([&] { sim::ReadAlibabaGenAiRequests(path, skip); });
    Expect([&] { sim::ReadAzureLlmRequests(path, sim::LlmServiceModel{}, skip); });
  }
  try {
    sim::ParseQueues(YAML::Load(std::string(reinterpret_cast<const char*>(data), size)), true);
  } catch (const YAML::Exception&) {
  } catch (const sim::QueuesError&) {
  }
  return 0;
}
