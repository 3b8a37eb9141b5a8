#pragma once

// The job verbs: submit, jobs, job show, logs, cancel. See docs/cli.md.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/types.h"
#include "cli/client.h"

namespace gpufleet::cli {

// `gpufleet submit` as typed. Optional fields are the flags that override a job file only when
// given.
struct SubmitArgs {
  std::string file;  // -f: a YAML (or JSON) job; "-" reads stdin
  std::optional<std::string> gpus;
  std::optional<int32_t> nodes;
  std::optional<int32_t> tasks_per_node;
  std::vector<std::string> gpu_models;
  std::optional<std::string> queue;
  std::optional<int32_t> priority;
  std::optional<std::string> name;
  std::optional<std::string> cpu;
  std::optional<std::string> memory;
  std::optional<std::string> min_gpu_memory;
  std::vector<std::string> env;  // NAME=VALUE each; added to (and override) the file's env
  std::optional<std::string> workdir;
  std::optional<std::string> image;
  std::vector<std::string> mounts;  // SOURCE:TARGET[:ro|rw] each
  std::optional<std::string> user;
  std::optional<std::string> max_runtime;
  std::optional<std::string> grace_period;
  std::optional<std::string> runtime_estimate;
  bool no_restart = false;
  bool not_preemptible = false;
  bool dry_run = false;
  std::vector<std::string> command;  // after --; replaces the file's command
};

// A YAML job file as the API's JSON: plain scalars become numbers and booleans where they read as
// such, except in fields that are strings (command, env, name, ...) so `command: [sleep, 60]`
// means what it says. Nothing (and `error`, naming `source` and the line) when the YAML is
// malformed or not a mapping. `lines` gets the line of each top-level key, for messages.
std::optional<nlohmann::json> JobYamlToJson(std::string_view text, std::string_view source,
                                            std::string& error,
                                            std::map<std::string, int>* lines = nullptr);

// The whole of a file the user named ("-": stdin); nothing and "cannot read <what> '<path>': ..."
// when it cannot be read.
std::optional<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                         std::string& error);

// "NAME=VALUE" entries as a map; nothing (and `error`) when one has no '=' or no name.
std::optional<std::map<std::string, std::string>> ParseEnvFlags(
    const std::vector<std::string>& entries, std::string& error);

struct Submission {
  nlohmann::json body;  // what is sent: the file's fields overridden by the flags
  api::JobSubmission job;
};

// The job to submit, checked as the server checks it (api::ParseJobSubmission), so messages
// match the API's; a bad field from the file is named with the file and line, a bad flag by the
// flag. Reads args.file when set.
std::optional<Submission> BuildSubmission(const SubmitArgs& args, std::string& error);

// "pending (queue default, 2 x 1 GPU)": the tail of submit's confirmation.
std::string DescribeSubmitted(const api::JobRecord& record);

struct JobArgs {
  ConnectionArgs connection;
  SubmitArgs submit;
  // jobs
  std::string state;
  std::string queue;
  std::string team;
  std::string user;
  int32_t limit = 0;  // 0: the server's default
  // job show, logs, cancel
  std::vector<std::string> ids;
  bool follow = false;
  int32_t task = 0;
  bool stderr_stream = false;

  CLI::App* submit_command = nullptr;
  CLI::App* jobs_command = nullptr;
  CLI::App* job_command = nullptr;
  CLI::App* show_command = nullptr;
  CLI::App* logs_command = nullptr;
  CLI::App* cancel_command = nullptr;
};

// The top-level commands AddJobCommands adds, so that a run builds only the group it uses.
inline constexpr std::string_view kJobCommandNames[] = {"submit", "jobs", "job", "logs", "cancel"};
void AddJobCommands(CLI::App& app, JobArgs& args);
// The exit code of the job verb that was given; nothing when none was.
std::optional<int> RunJobCommands(const JobArgs& args);

// The jobs table for a list of records, as `gpufleet jobs` prints it at `now_ms`.
std::string JobsTable(const std::vector<api::JobRecord>& jobs, TimeMs now_ms);

}  // namespace gpufleet::cli
