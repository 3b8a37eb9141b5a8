#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "sched/queues.h"
#include "sim/trace.h"

namespace YAML {
class Node;
}

namespace gpufleet::sim {

// One entry of a queues file (docs/sim.md, "Team queues"): the queue, and which trace jobs it
// takes.
struct QueueEntry {
  sched::QueueConfig config;
  // Trace virtual clusters / users whose jobs go to this queue; "*" takes every job no other
  // queue lists. Only used by --queue-by vc.
  std::vector<std::string> members;
};

class QueuesError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses a YAML list of queues. Unknown keys are errors; `members` only where allowed. Validates
// the list (sched::ValidateQueues). Throws QueuesError.
std::vector<QueueEntry> ParseQueues(const YAML::Node& list, bool allow_members);
std::vector<QueueEntry> LoadQueuesFile(const std::filesystem::path& path);

// How trace jobs are assigned to queues.
enum class QueueBy {
  kVc,          // the trace's virtual cluster (Philly `cluster`) or user: `members`, else a queue
                // of that name, else the "*" queue
  kRoundRobin,  // job i goes to queue i mod n, for traces without such a column
};
std::optional<QueueBy> ParseQueueBy(std::string_view name);

// Sets every job's spec.queue to its queue's name. Throws QueuesError naming the first job whose
// virtual cluster no queue takes.
void AssignQueues(Trace& trace, const std::vector<QueueEntry>& queues, QueueBy by);

}  // namespace gpufleet::sim
