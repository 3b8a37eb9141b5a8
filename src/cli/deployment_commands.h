#pragma once

// The deployment verbs: deploy, deployments, deployment show, scale, delete. See docs/cli.md and
// docs/serving.md.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/types.h"
#include "cli/client.h"

namespace gpufleet::cli {

struct DeploymentArgs {
  ConnectionArgs connection;
  // deploy
  std::string file;  // -f: YAML or JSON; "-" reads stdin
  bool dry_run = false;
  // deployment show, scale, delete
  std::string name;
  std::optional<int32_t> replicas;
  bool to_auto = false;
  std::optional<int32_t> min_replicas;
  std::optional<int32_t> max_replicas;

  CLI::App* deploy_command = nullptr;
  CLI::App* list_command = nullptr;
  CLI::App* show_command = nullptr;
  CLI::App* scale_command = nullptr;
  CLI::App* delete_command = nullptr;      // deployment delete NAME
  CLI::App* delete_top_command = nullptr;  // delete NAME
};

// The top-level commands AddDeploymentCommands adds.
inline constexpr std::string_view kDeploymentCommandNames[] = {"deploy", "deployments",
                                                               "deployment", "scale", "delete"};
void AddDeploymentCommands(CLI::App& app, DeploymentArgs& args);
// The exit code of the deployment verb that was given; nothing when none was.
std::optional<int> RunDeploymentCommands(const DeploymentArgs& args);

// A deployment file as the API's JSON, checked as the server checks it; a bad field is named with
// the file and its line.
std::optional<nlohmann::json> BuildDeployment(const std::string& file, std::string& error);

// What `gpufleet deployments` and `gpufleet deployment show` print at `now_ms`.
std::string DeploymentsTable(const std::vector<api::DeploymentRecord>& deployments, TimeMs now_ms);
std::string ShowDeployment(const api::DeploymentRecord& deployment, TimeMs now_ms);

}  // namespace gpufleet::cli
