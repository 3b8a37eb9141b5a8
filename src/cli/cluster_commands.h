#pragma once

// The cluster verbs: nodes (and nodes drain/undrain), queues, top, token create/list/revoke,
// whoami, audit. See docs/cli.md.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/types.h"
#include "cli/client.h"

namespace gpufleet::cli {

struct ClusterArgs {
  ConnectionArgs connection;
  std::string name;  // node name (drain, undrain) or token id (revoke)
  // top
  bool once = false;
  std::string interval = "2s";
  // token create
  std::string user;
  std::string team;
  std::string role;
  std::string scope;       // empty: the role's default
  std::string expires_in;  // empty: never
  // token rotate
  std::string overlap = "1h";
  // audit
  int32_t limit = 0;
  // usage
  std::string since = "7d";
  std::string until;  // empty: now
  std::string by = "team";

  CLI::App* nodes = nullptr;
  CLI::App* drain = nullptr;
  CLI::App* undrain = nullptr;
  CLI::App* queues = nullptr;
  CLI::App* top = nullptr;
  CLI::App* token = nullptr;
  CLI::App* token_create = nullptr;
  CLI::App* token_list = nullptr;
  CLI::App* token_revoke = nullptr;
  CLI::App* token_rotate = nullptr;
  CLI::App* whoami = nullptr;
  CLI::App* audit = nullptr;
  CLI::App* usage = nullptr;
};

// The top-level commands AddClusterCommands adds.
inline constexpr std::string_view kClusterCommandNames[] = {"nodes",  "queues", "top",  "token",
                                                            "whoami", "usage",  "audit"};
void AddClusterCommands(CLI::App& app, ClusterArgs& args);
// The exit code of the cluster verb that was given; nothing when none was.
std::optional<int> RunClusterCommands(const ClusterArgs& args);

// A point in time for `usage`: a span back from now ("7d", "24h", "90m") or a UTC date
// ("2026-12-01"); nothing (and `error` set) otherwise.
std::optional<TimeMs> ParseSince(const std::string& text, TimeMs now_ms, std::string& error);

std::string NodesTable(const std::vector<api::NodeRecord>& nodes, TimeMs now_ms);

// One screen of `gpufleet top`: a summary, then one row per GPU. At most `max_rows` GPU rows
// (0: all); a last line says how many did not fit.
std::string TopFrame(const std::vector<api::NodeRecord>& nodes,
                     const std::vector<api::QueueStatus>& queues, const std::string& server,
                     TimeMs now_ms, size_t max_rows);

}  // namespace gpufleet::cli
