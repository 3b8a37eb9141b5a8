#include "cli/deployment_commands.h"

#include <map>

#include <fmt/format.h>

#include "api/json.h"
#include "cli/job_commands.h"
#include "cli/table.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// The top-level field an API error names: "'autoscaling.target' must be ..." is about
// autoscaling; "unknown deployment field 'x'" about x.
std::string TopFieldOfError(std::string_view error) {
  const size_t start = error.find('\'');
  if (start == std::string_view::npos) return "";
  const size_t end = error.find_first_of("'.[", start + 1);
  if (end == std::string_view::npos) return "";
  return std::string(error.substr(start + 1, end - start - 1));
}

std::optional<api::DeploymentRecord> RecordOf(const json& body) {
  try {
    return body.get<api::DeploymentRecord>();
  } catch (const std::exception& error) {
    Fail(fmt::format("the server answered a deployment that is not one: {}", error.what()));
  }
  return std::nullopt;
}

std::string Replicas(const api::DeploymentRecord& record) {
  return fmt::format("{}/{}", record.ready_replicas, record.desired_replicas);
}

std::string Scaling(const api::DeploymentRecord& record) {
  if (record.fixed_replicas) return fmt::format("fixed {}", *record.fixed_replicas);
  return fmt::format("{}-{} ({} {:g})", record.spec.min_replicas, record.spec.max_replicas,
                     record.spec.autoscaling.metric, record.spec.autoscaling.target);
}

// An answer holding one deployment: printed as JSON (-o json), or its record handed to `show`.
template <typename Show>
int Answered(const DeploymentArgs& args, const ApiResult& answer, Show show) {
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto record = RecordOf(answer.body);
  if (!record) return kExitFailure;
  show(*record);
  return 0;
}

int RunDeploy(const DeploymentArgs& args) {
  std::string error;
  auto body = BuildDeployment(args.file, error);
  if (!body) {
    fmt::print(stderr, "error: {}\n", error);
    return kExitUsage;
  }
  if (args.dry_run) {
    PrintJson(*body);
    return 0;
  }
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  ApiResult answer = client->Post("/deployments", *body);
  return Answered(args, answer, [&](const api::DeploymentRecord& record) {
    fmt::print("deployment {} {} (generation {}): {} replica(s) wanted, {}\n", record.name,
               answer.status == 201 ? "created" : "updated", record.generation,
               record.desired_replicas, Scaling(record));
  });
}

int RunList(const DeploymentArgs& args) {
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  ApiResult answer = client->Get("/deployments");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  std::vector<api::DeploymentRecord> records;
  for (const json& item : ListIn(answer.body, "deployments")) {
    auto record = RecordOf(item);
    if (!record) return kExitFailure;
    records.push_back(std::move(*record));
  }
  if (records.empty()) {
    fmt::print("no deployments\n");
    return 0;
  }
  fmt::print("{}", DeploymentsTable(records, NowMs()));
  return 0;
}

int RunShow(const DeploymentArgs& args) {
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  return Answered(args, client->Get("/deployments/" + UrlEncode(args.name)),
                  [](const api::DeploymentRecord& record) {
                    fmt::print("{}", ShowDeployment(record, NowMs()));
                  });
}

int RunScale(const DeploymentArgs& args) {
  json body = json::object();
  if (args.replicas) body["replicas"] = *args.replicas;
  if (args.to_auto) body["auto"] = true;
  if (args.min_replicas) body["min_replicas"] = *args.min_replicas;
  if (args.max_replicas) body["max_replicas"] = *args.max_replicas;
  if (body.empty()) {
    fmt::print(stderr,
               "error: give a replica count (gpufleet scale NAME 3), --auto, or --min/--max\n");
    return kExitUsage;
  }
  if (args.replicas && args.to_auto) {
    fmt::print(stderr, "error: give a replica count or --auto, not both\n");
    return kExitUsage;
  }
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  return Answered(args, client->Post("/deployments/" + UrlEncode(args.name) + "/scale", body),
                  [](const api::DeploymentRecord& record) {
                    fmt::print("deployment {}: {} replica(s) wanted, {}\n", record.name,
                               record.desired_replicas, Scaling(record));
                  });
}

int RunDelete(const DeploymentArgs& args) {
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  return Answered(args, client->Call("DELETE", "/deployments/" + UrlEncode(args.name)),
                  [](const api::DeploymentRecord& record) {
                    fmt::print("deployment {} deleted: {} replica(s) stopping\n", record.name,
                               record.replicas.size());
                  });
}

}  // namespace

std::optional<json> BuildDeployment(const std::string& file, std::string& error) {
  if (file.empty()) {
    error = "give the deployment file: gpufleet deploy -f model.yaml";
    return std::nullopt;
  }
  const std::string source = file == "-" ? "<stdin>" : file;
  auto text = ReadInputFile(file, "deployment file", error);
  if (!text) return std::nullopt;
  std::map<std::string, int> lines;
  auto body = JobYamlToJson(*text, source, error, &lines);
  if (!body) return std::nullopt;
  std::string api_error;
  if (!api::ParseDeploymentSpec(*body, api_error)) {
    auto line = lines.find(TopFieldOfError(api_error));
    error = line != lines.end() ? fmt::format("{}:{}: {}", source, line->second, api_error)
                                : fmt::format("{}: {}", source, api_error);
    return std::nullopt;
  }
  return body;
}

std::string DeploymentsTable(const std::vector<api::DeploymentRecord>& deployments, TimeMs now_ms) {
  Table table({{"NAME"},
               {"TEAM"},
               {"READY", 0, true},
               {"SCALING"},
               {"GPUS/REPLICA", 0, true},
               {"ROUTING"},
               {"GEN", 0, true},
               {"AGE", 0, true},
               {"WHY", 60}});
  for (const api::DeploymentRecord& record : deployments)
    table.Add({record.name, record.team, Replicas(record), Scaling(record),
               api::FormatGpus(record.spec.gpu_milli_per_replica), record.spec.routing,
               std::to_string(record.generation), FormatAge(record.created_ms, now_ms),
               record.desired_reason});
  return table.Render();
}

std::string ShowDeployment(const api::DeploymentRecord& record, TimeMs now_ms) {
  const api::DeploymentSpec& spec = record.spec;
  std::string out;
  out += fmt::format("Deployment:   {}\n", record.name);
  out += fmt::format("Team:         {} (created by {}, {} ago)\n", record.team, record.user,
                     FormatAge(record.created_ms, now_ms));
  out += fmt::format("Command:      {}\n", fmt::join(spec.command, " "));
  out += fmt::format("Replicas:     {} ready of {} wanted ({})\n", record.ready_replicas,
                     record.desired_replicas, record.desired_reason);
  out += fmt::format("Scaling:      {}\n", Scaling(record));
  out += fmt::format(
      "Autoscaler:   target {:g} x {:g} utilization, stable {} / panic {} at {:g}x, to zero "
      "after {}\n",
      spec.autoscaling.target, spec.autoscaling.target_utilization,
      FormatDuration(spec.autoscaling.stable_window_ms),
      FormatDuration(spec.autoscaling.panic_window_ms), spec.autoscaling.panic_threshold,
      FormatDuration(spec.autoscaling.scale_to_zero_grace_ms));
  out += fmt::format("Per replica:  {} (queue {}, priority {})\n",
                     FormatGpuCount(spec.gpu_milli_per_replica), spec.queue, spec.priority);
  out += fmt::format(
      "Routing:      {}; models: {}\n", spec.routing,
      spec.models.empty() ? record.name : fmt::format("{}", fmt::join(spec.models, ", ")));
  out += fmt::format("Readiness:    GET {} on $PORT\n", spec.readiness_path);
  out += fmt::format("Generation:   {}\n", record.generation);
  if (record.failures_in_a_row > 0)
    out += fmt::format("Failures:     {} in a row, last {} ago (restarts back off)\n",
                       record.failures_in_a_row, FormatAge(record.last_failure_ms, now_ms));
  if (record.replicas.empty()) {
    out += "No replicas.\n";
    return out;
  }
  Table table({{"JOB", 0, true}, {"GEN", 0, true}, {"STATE"}, {"NODE"}, {"ENDPOINT"}, {"AGE"}});
  for (const api::ReplicaStatus& replica : record.replicas)
    table.Add({std::to_string(replica.job_id), std::to_string(replica.generation), replica.state,
               replica.node.empty() ? "-" : replica.node,
               replica.port > 0 ? fmt::format("{}:{}", replica.host, replica.port) : "-",
               FormatAge(replica.created_ms, now_ms)});
  out += "\n" + table.Render();
  return out;
}

void AddDeploymentCommands(CLI::App& app, DeploymentArgs& args) {
  CLI::App* command = app.add_subcommand(
      "deploy", "Create or update a deployment (a model server behind the gateway): -f model.yaml");
  args.deploy_command = command;
  command->add_option("-f,--file", args.file, "Deployment file (YAML or JSON; '-' reads stdin)")
      ->required();
  command->add_flag("--dry-run", args.dry_run,
                    "Check the file and print it as it would be sent; deploy nothing");
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand("deployments", "List deployments (your team's; admins see all)");
  args.list_command = command;
  AddConnectionOptions(*command, args.connection);

  CLI::App* group =
      app.add_subcommand("deployment", "Inspect one deployment: deployment show NAME");
  group->require_subcommand(1);
  command = group->add_subcommand("show", "A deployment's spec, scale and replicas");
  args.show_command = command;
  command->add_option("name", args.name, "Deployment name")->required();
  AddConnectionOptions(*command, args.connection);
  command = group->add_subcommand("delete", "Delete a deployment and stop its replicas");
  args.delete_command = command;
  command->add_option("name", args.name, "Deployment name")->required();
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand(
      "scale", "Scale a deployment: scale NAME 3 (fixed), scale NAME --auto, --min/--max bounds");
  args.scale_command = command;
  command->add_option("name", args.name, "Deployment name")->required();
  command->add_option_function<int32_t>(
      "replicas", [&args](const int32_t& value) { args.replicas = value; },
      "Replicas to run; the autoscaler stops until --auto");
  command->add_flag("--auto", args.to_auto, "Hand the replica count back to the autoscaler");
  command->add_option_function<int32_t>(
      "--min", [&args](const int32_t& value) { args.min_replicas = value; },
      "The autoscaler's lower bound (0 scales to zero)");
  command->add_option_function<int32_t>(
      "--max", [&args](const int32_t& value) { args.max_replicas = value; },
      "The autoscaler's upper bound");
  AddConnectionOptions(*command, args.connection);

  command = app.add_subcommand("delete", "Delete a deployment: gpufleet delete NAME");
  args.delete_top_command = command;
  command->add_option("name", args.name, "Deployment name")->required();
  AddConnectionOptions(*command, args.connection);
}

std::optional<int> RunDeploymentCommands(const DeploymentArgs& args) {
  if (*args.deploy_command) return RunDeploy(args);
  if (*args.list_command) return RunList(args);
  if (*args.show_command) return RunShow(args);
  if (*args.scale_command) return RunScale(args);
  if (*args.delete_command || *args.delete_top_command) return RunDelete(args);
  return std::nullopt;
}

}  // namespace gpufleet::cli
