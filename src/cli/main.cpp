// The `gpufleet` command line.

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/agent_command.h"
#include "cli/cluster_commands.h"
#include "cli/deployment_commands.h"
#include "cli/dev_command.h"
#include "cli/gateway_command.h"
#include "cli/job_commands.h"
#include "cli/server_command.h"
#include "cli/sim_command.h"
#include "core/version.h"

namespace {

constexpr int kExitUsage = 2;

// App::help() of a parsed app delegates to the chosen subcommand; the formatter does not.
std::string HelpText(CLI::App& command, const std::string& usage_name) {
  return command.get_formatter()->make_help(&command, usage_name, CLI::AppFormatMode::Normal);
}

int PrintHelp(CLI::App& app, const std::vector<std::string>& topic) {
  if (topic.empty()) {
    fmt::print("{}", HelpText(app, "gpufleet"));
    return 0;
  }
  for (CLI::App* command : app.get_subcommands({})) {
    if (command->get_name() == topic.front()) {
      fmt::print("{}", HelpText(*command, "gpufleet " + command->get_name()));
      return 0;
    }
  }
  fmt::print(stderr, "error: no command '{}'; run 'gpufleet help'\n", topic.front());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // The agent's per-workload supervisor (docs/agent-execution.md): its arguments must reach it
  // untouched, so it is dispatched before CLI11 sees them.
  if (argc >= 2 && std::string_view(argv[1]) == "agent-shim")
    return gpufleet::cli::RunAgentShim(argc - 1, argv + 1);

  CLI::App app{
      "gpufleet: scheduling for GPU clusters, and a simulator to judge policies on "
      "real traces",
      "gpufleet"};
  app.set_version_flag("--version", std::string("gpufleet ") + gpufleet::kVersion);

  // Listed here for the help text; handled before parsing, because CLI11 would read a command
  // name after it ("gpufleet help sim") as that command rather than as an argument.
  app.add_subcommand("help", "Show help for gpufleet or one of its commands")
      ->add_option("command", "Command to explain");

  // Building every command's options costs more than a short verb's whole run (a third of
  // `gpufleet submit`'s CPU time): build only the group that argv[1] names, and all of them
  // for help, a bare `gpufleet` or a name that is no command.
  const std::string_view first = argc >= 2 ? argv[1] : "";
  const auto names_one_of = [first](const auto& names) {
    return std::find(std::begin(names), std::end(names), first) != std::end(names);
  };
  const bool known = first == "sim" || first == "agent" || first == "server" || first == "dev" ||
                     first == "gateway" || names_one_of(gpufleet::cli::kJobCommandNames) ||
                     names_one_of(gpufleet::cli::kClusterCommandNames) ||
                     names_one_of(gpufleet::cli::kDeploymentCommandNames);
  const auto wanted = [&](std::string_view name) { return !known || first == name; };
  const auto wanted_group = [&](const auto& names) { return !known || names_one_of(names); };

  gpufleet::cli::SimArgs sim_args;
  CLI::App* sim = wanted("sim") ? gpufleet::cli::AddSimCommand(app, sim_args) : nullptr;
  gpufleet::cli::AgentArgs agent_args;
  CLI::App* agent = wanted("agent") ? gpufleet::cli::AddAgentCommand(app, agent_args) : nullptr;
  gpufleet::cli::ServerArgs server_args;
  CLI::App* server = wanted("server") ? gpufleet::cli::AddServerCommand(app, server_args) : nullptr;
  gpufleet::cli::DevArgs dev_args;
  CLI::App* dev = wanted("dev") ? gpufleet::cli::AddDevCommand(app, dev_args) : nullptr;
  gpufleet::cli::GatewayArgs gateway_args;
  CLI::App* gateway =
      wanted("gateway") ? gpufleet::cli::AddGatewayCommand(app, gateway_args) : nullptr;
  gpufleet::cli::JobArgs job_args;
  const bool jobs = wanted_group(gpufleet::cli::kJobCommandNames);
  if (jobs) gpufleet::cli::AddJobCommands(app, job_args);
  gpufleet::cli::ClusterArgs cluster_args;
  const bool cluster = wanted_group(gpufleet::cli::kClusterCommandNames);
  if (cluster) gpufleet::cli::AddClusterCommands(app, cluster_args);
  gpufleet::cli::DeploymentArgs deployment_args;
  const bool deployments = wanted_group(gpufleet::cli::kDeploymentCommandNames);
  if (deployments) gpufleet::cli::AddDeploymentCommands(app, deployment_args);

  if (first == "help") return PrintHelp(app, std::vector<std::string>(argv + 2, argv + argc));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version arrive as "errors" with exit code 0; CLI11 prints them.
    if (error.get_exit_code() == 0) return app.exit(error);
    // CLI11's own exit codes vary by error kind; every usage error exits 2 here.
    fmt::print(stderr, "error: {}\nrun 'gpufleet help' or 'gpufleet <command> --help'\n",
               error.what());
    return kExitUsage;
  }
  if (sim && *sim) return gpufleet::cli::RunSim(sim_args);
  if (agent && *agent) return gpufleet::cli::RunAgent(agent_args);
  if (server && *server) return gpufleet::cli::RunServer(server_args);
  if (dev && *dev) return gpufleet::cli::RunDev(dev_args);
  if (gateway && *gateway) return gpufleet::cli::RunGateway(gateway_args);
  if (auto code = jobs ? gpufleet::cli::RunJobCommands(job_args) : std::nullopt) return *code;
  if (auto code = cluster ? gpufleet::cli::RunClusterCommands(cluster_args) : std::nullopt)
    return *code;
  if (auto code =
          deployments ? gpufleet::cli::RunDeploymentCommands(deployment_args) : std::nullopt)
    return *code;
  fmt::print(stderr, "{}", HelpText(app, "gpufleet"));
  return kExitUsage;
}
