#include "sim/queues.h"

#include <cmath>
#include <unordered_map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace gpufleet::sim {
namespace {

[[noreturn]] void Fail(const YAML::Node& node, const std::string& message) {
  throw QueuesError(fmt::format("line {}: {}", node.Mark().line + 1, message));
}

// GPUs (possibly fractional) as milli-GPUs.
int64_t Milli(const YAML::Node& node) {
  double gpus = 0;
  try {
    gpus = node.as<double>();
  } catch (const YAML::Exception&) {
    Fail(node, "expected a number of GPUs");
  }
  const double milli = gpus * 1000.0;
  if (!(milli >= 0) || std::abs(milli - std::round(milli)) > 1e-6)
    Fail(node, "GPUs must be a non-negative multiple of 0.001");
  return std::llround(milli);
}

}  // namespace

std::vector<QueueEntry> ParseQueues(const YAML::Node& list, bool allow_members) {
  if (!list.IsSequence()) Fail(list, "queues must be a YAML list");
  std::vector<QueueEntry> entries;
  for (const YAML::Node& item : list) {
    if (!item.IsMap()) Fail(item, "a queue must be a map");
    QueueEntry entry;
    sched::QueueConfig& queue = entry.config;
    for (const auto& field : item) {
      const std::string key = field.first.as<std::string>();
      const YAML::Node& value = field.second;
      if (key == "name") {
        queue.name = value.as<std::string>();
      } else if (key == "cohort") {
        queue.cohort = value.as<std::string>();
      } else if (key == "guaranteed_gpus") {
        if (value.IsMap()) {
          for (const auto& model : value)
            queue.guaranteed_milli_by_model[model.first.as<std::string>()] = Milli(model.second);
          if (queue.guaranteed_milli_by_model.empty()) Fail(value, "no GPU model given");
        } else {
          queue.guaranteed_milli = Milli(value);
        }
      } else if (key == "borrowing_limit_gpus") {
        queue.borrowing_limit_milli = Milli(value);
      } else if (key == "weight") {
        queue.weight = value.as<double>();
      } else if (key == "reclaim_idle") {
        queue.reclaim_idle = value.as<bool>();
      } else if (key == "preemptible_replicas") {
        queue.preemptible_replicas = value.as<bool>();
      } else if (key == "teams") {
        if (!value.IsSequence()) Fail(value, "teams must be a list of team names");
        for (const YAML::Node& team : value) {
          queue.teams.push_back(team.as<std::string>());
          if (queue.teams.back().empty()) Fail(team, "a team name must not be empty");
        }
      } else if (key == "members" && allow_members) {
        entry.members = value.as<std::vector<std::string>>();
      } else {
        Fail(field.first, fmt::format("unknown queue key '{}'", key));
      }
    }
    entries.push_back(std::move(entry));
  }
  std::vector<sched::QueueConfig> configs;
  for (const QueueEntry& entry : entries)
    configs.push_back(entry.config);
  if (const auto error = sched::ValidateQueues(configs)) throw QueuesError(*error);
  return entries;
}

std::vector<QueueEntry> LoadQueuesFile(const std::filesystem::path& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& error) {
    throw QueuesError(fmt::format("{}: {}", path.string(), error.what()));
  }
  try {
    auto entries = ParseQueues(root, true);
    if (entries.empty()) throw QueuesError("no queue given");
    return entries;
  } catch (const QueuesError& error) {
    throw QueuesError(fmt::format("{}: {}", path.string(), error.what()));
  } catch (const YAML::Exception& error) {
    throw QueuesError(fmt::format("{}: {}", path.string(), error.what()));
  }
}

std::optional<QueueBy> ParseQueueBy(std::string_view name) {
  if (name == "vc" || name == "user") return QueueBy::kVc;
  if (name == "round-robin") return QueueBy::kRoundRobin;
  return std::nullopt;
}

void AssignQueues(Trace& trace, const std::vector<QueueEntry>& queues, QueueBy by) {
  if (queues.empty()) return;
  if (by == QueueBy::kRoundRobin) {
    for (size_t i = 0; i < trace.jobs.size(); ++i)
      trace.jobs[i].spec.queue = queues[i % queues.size()].config.name;
    return;
  }
  std::unordered_map<std::string, const std::string*> by_vc;
  const std::string* catch_all = nullptr;
  for (const QueueEntry& entry : queues) {
    for (const std::string& member : entry.members) {
      if (member == "*") {
        catch_all = &entry.config.name;
      } else if (!by_vc.emplace(member, &entry.config.name).second) {
        throw QueuesError(fmt::format("'{}' is a member of two queues", member));
      }
    }
  }
  for (const QueueEntry& entry : queues)
    by_vc.emplace(entry.config.name, &entry.config.name);  // a queue named as the VC
  for (TraceJob& job : trace.jobs) {
    auto it = by_vc.find(job.spec.queue);
    if (it != by_vc.end()) {
      job.spec.queue = *it->second;
    } else if (catch_all) {
      job.spec.queue = *catch_all;
    } else {
      throw QueuesError(fmt::format(
          "{}:{}: no queue takes virtual cluster '{}' (list it under a queue's members, or add "
          "a queue with members: [\"*\"], or use --queue-by round-robin)",
          trace.source, job.line, job.spec.queue));
    }
  }
}

}  // namespace gpufleet::sim
