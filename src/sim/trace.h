#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/job.h"

namespace gpufleet::sim {

// A job as a trace records it: what it asked for, when it arrived and how long it ran.
struct TraceJob {
  JobSpec spec;          // spec.id is the position in the trace (0-based); submit_time set
  TimeMs duration = 0;   // run time with its GPUs, without queueing
  std::string trace_id;  // the trace's own job id or pod name, when it has one
  int64_t line = 0;      // 1-based line in the source file, for messages
};

struct Trace {
  std::string source;                      // file path (or several, joined by ", ")
  std::vector<TraceJob> jobs;              // sorted by submit time, ties in file order
  int64_t skipped = 0;                     // invalid rows skipped under skip_invalid
  std::vector<std::string> skip_examples;  // the first few skip messages, "file:line: why"
};

// Malformed input: the message always starts with "file:line: ".
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ReadOptions {
  bool skip_invalid = false;  // count and skip bad rows instead of failing on the first
  int32_t gpus_per_node = 8;  // to split multi-node GPU counts into gangs (SetGangShape)
  int64_t limit = 0;          // read at most this many jobs (0 = all)
};

}  // namespace gpufleet::sim
