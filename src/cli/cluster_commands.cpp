#include "cli/cluster_commands.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/ioctl.h>
#include <unistd.h>

#include "api/json.h"
#include "cli/table.h"
#include "core/quantity.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// Every element of an answer's list as T; prints why not (a server of another version).
template <typename T>
std::optional<std::vector<T>> ListOf(const ApiResult& answer, const char* key) {
  std::vector<T> items;
  try {
    for (const json& item : ListIn(answer.body, key))
      items.push_back(item.get<T>());
  } catch (const std::exception& error) {
    Fail(fmt::format("unexpected {} from the server: {}", key, error.what()));
    return std::nullopt;
  }
  return items;
}

size_t UsedGpus(const api::NodeRecord& node) {
  return static_cast<size_t>(
      std::count_if(node.gpu_jobs.begin(), node.gpu_jobs.end(),
                    [](const auto& entry) { return !entry.second.empty(); }));
}

std::string NodeState(const api::NodeRecord& node) {
  std::string state(api::NodeStateName(node.state));
  if (node.drained && node.state != api::NodeState::kDraining) state += ",drained";
  return state;
}

std::string GpuModels(const api::NodeReport& report) {
  std::set<std::string> models;
  for (const api::GpuStatus& gpu : report.gpus)
    models.insert(gpu.model);
  if (models.empty()) return "-";
  return fmt::format("{}", fmt::join(models, ","));
}

std::string GpuMemory(const api::GpuStatus& gpu) {
  return fmt::format("{:.1f}/{:.1f}Gi", static_cast<double>(gpu.memory_used_mib) / 1024,
                     static_cast<double>(gpu.memory_mib) / 1024);
}

std::string JobIds(const std::vector<JobId>& ids) {
  if (ids.empty()) return "-";
  return fmt::format("{}", fmt::join(ids, ","));
}

// The terminal's height; 0 when stdout is not a terminal.
size_t TerminalRows() {
  winsize size{};
  if (::isatty(STDOUT_FILENO) == 0 || ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_row;
}

// ---- The verbs ----------------------------------------------------------------------------------

int RunNodes(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Get("/nodes");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto nodes = ListOf<api::NodeRecord>(answer, "nodes");
  if (!nodes) return kExitFailure;
  if (nodes->empty()) {
    fmt::print(stderr, "No nodes have registered yet (start one with 'gpufleet agent').\n");
    return 0;
  }
  fmt::print("{}", NodesTable(*nodes, NowMs()));
  return 0;
}

int RunDrain(const ClusterArgs& args, const Client& client, bool drain) {
  ApiResult answer = client.Call(
      "POST", fmt::format("/nodes/{}/{}", UrlEncode(args.name), drain ? "drain" : "undrain"));
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  if (drain)
    fmt::print("node {} drained: no new jobs are placed there; running jobs go on\n", args.name);
  else
    fmt::print("node {} undrained: it takes new jobs again\n", args.name);
  return 0;
}

int RunQueues(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Get("/queues");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto queues = ListOf<api::QueueStatus>(answer, "queues");
  if (!queues) return kExitFailure;
  if (queues->empty()) {
    fmt::print(stderr, "No queue has pending or running jobs.\n");
    return 0;
  }
  const bool quotas = std::any_of(queues->begin(), queues->end(),
                                  [](const api::QueueStatus& queue) { return queue.configured; });
  std::vector<Table::Column> columns = {{"QUEUE"},
                                        {"PENDING", 0, true},
                                        {"RUNNING", 0, true},
                                        {"GPUS-PENDING", 0, true},
                                        {"GPUS-RUNNING", 0, true}};
  if (quotas) {
    columns.push_back({"GUARANTEED", 0, true});
    columns.push_back({"BORROW-LIMIT", 0, true});
    columns.push_back({"COHORT"});
    columns.push_back({"WEIGHT", 0, true});
    columns.push_back({"TEAMS"});
  }
  // Decayed usage and the fair-share factor that orders queues under `--policy fairshare`.
  columns.push_back({"USAGE-GPU-H", 0, true});
  columns.push_back({"FAIR-SHARE", 0, true});
  Table table(columns);
  for (const api::QueueStatus& queue : *queues) {
    std::vector<std::string> cells = {
        queue.name, std::to_string(queue.pending), std::to_string(queue.running),
        api::FormatGpus(queue.gpu_milli_pending), api::FormatGpus(queue.gpu_milli_running)};
    if (quotas) {
      cells.push_back(api::FormatGpus(queue.gpu_milli_guaranteed));
      cells.push_back(queue.gpu_milli_borrowing_limit
                          ? api::FormatGpus(*queue.gpu_milli_borrowing_limit)
                          : "-");
      cells.push_back(queue.cohort.empty() ? "-" : queue.cohort);
      cells.push_back(fmt::format("{:g}", queue.weight));
      cells.push_back(queue.teams.empty() ? "*" : fmt::format("{}", fmt::join(queue.teams, ",")));
    }
    cells.push_back(fmt::format("{:.2f}", queue.fair_share_usage_gpu_hours));
    cells.push_back(fmt::format("{:.3f}", queue.fair_share_factor));
    table.Add(cells);
  }
  fmt::print("{}", table.Render());
  return 0;
}

}  // namespace

std::optional<TimeMs> ParseSince(const std::string& text, TimeMs now_ms, std::string& error) {
  int year = 0, month = 0, day = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2d%c", &year, &month, &day, &tail) == 3 && month >= 1 &&
      month <= 12 && day >= 1 && day <= 31) {
    std::tm date{};
    date.tm_year = year - 1900;
    date.tm_mon = month - 1;
    date.tm_mday = day;
    return static_cast<TimeMs>(::timegm(&date)) * 1000;
  }
  // Days are what people ask usage for; ParseDurationMs stops at hours.
  std::optional<TimeMs> back;
  if (text.size() > 1 && text.back() == 'd') {
    auto days = ParseDurationMs(text.substr(0, text.size() - 1) + "h");
    if (days) back = *days * 24;
  } else {
    back = ParseDurationMs(text);
  }
  if (!back || *back <= 0) {
    error = fmt::format(
        "'{}': expected a span back from now such as 7d, 24h or 30m, or a date "
        "such as 2026-12-01",
        text);
    return std::nullopt;
  }
  return std::max<TimeMs>(0, now_ms - *back);
}

namespace {

int RunUsage(const ClusterArgs& args, const Client& client) {
  const TimeMs now = NowMs();
  std::string error;
  auto since = ParseSince(args.since, now, error);
  // Bad flags exit 2, as every other command's do; only the server's answer exits 1.
  const auto bad_flag = [](std::string_view message) {
    Fail(message);
    return kExitUsage;
  };
  if (!since) return bad_flag("--since " + error);
  TimeMs until = now;
  if (!args.until.empty()) {
    auto parsed = ParseSince(args.until, now, error);
    if (!parsed) return bad_flag("--until " + error);
    until = *parsed;
  }
  if (until <= *since) return bad_flag("--until must be later than --since");
  ApiResult answer = client.Get(
      fmt::format("/usage?since_ms={}&until_ms={}&by={}", *since, until, UrlEncode(args.by)));
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  const nlohmann::json& rows = answer.body.at("usage");
  if (rows.empty()) {
    fmt::print(stderr, "No GPU was held by jobs you can see between {} and {}.\n",
               FormatTime(*since), FormatTime(until));
    return 0;
  }
  const bool by_user = args.by == "user";
  std::vector<Table::Column> columns = {{"TEAM"}};
  if (by_user) columns.push_back({"USER"});
  columns.push_back({"GPU-HOURS", 0, true});
  columns.push_back({"JOBS", 0, true});
  Table table(columns);
  double total = 0;
  for (const nlohmann::json& row : rows) {
    std::vector<std::string> cells = {row.value("team", "")};
    if (by_user) cells.push_back(row.value("user", ""));
    const double hours = row.value("gpu_hours", 0.0);
    total += hours;
    cells.push_back(fmt::format("{:.2f}", hours));
    cells.push_back(std::to_string(row.value("jobs", 0)));
    table.Add(cells);
  }
  fmt::print("GPU-hours from {} to {}: {:.2f} in all\n{}", FormatTime(*since), FormatTime(until),
             total, table.Render());
  return 0;
}

int RunTop(const ClusterArgs& args, const Client& client) {
  auto interval = ParseDurationMs(args.interval);
  if (!interval || *interval < 100) {
    fmt::print(stderr, "error: --interval '{}': expected a duration of at least 100ms, e.g. 2s\n",
               args.interval);
    return kExitUsage;
  }
  const bool live = !args.once;
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  bool first = true;
  for (;;) {
    ApiResult nodes_answer = client.Get("/nodes");
    ApiResult queues_answer = nodes_answer.ok() ? client.Get("/queues") : nodes_answer;
    std::string problem = !nodes_answer.ok() ? nodes_answer.message : queues_answer.message;
    // The first frame must work; later, a hiccup is shown in place and retried, as top would.
    if (!problem.empty() && (first || !live)) return Fail(problem);
    first = false;
    std::string frame;
    if (problem.empty() && args.connection.json()) {
      frame = live ? nodes_answer.body.dump() + "\n" : nodes_answer.body.dump(2) + "\n";
    } else if (problem.empty()) {
      auto nodes = ListOf<api::NodeRecord>(nodes_answer, "nodes");
      auto queues = ListOf<api::QueueStatus>(queues_answer, "queues");
      if (!nodes || !queues) return kExitFailure;
      const size_t rows = live && terminal ? TerminalRows() : 0;
      // Six lines of summary and headers, one for the cursor.
      frame = TopFrame(*nodes, *queues, client.config().server, NowMs(),
                       rows > 8 ? rows - 7 : (rows > 0 ? 1 : 0));
    } else {
      frame = fmt::format("gpufleet top - {} - {}\nerror: {} (retrying every {})\n",
                          client.config().server, FormatTime(NowMs()), problem,
                          FormatDuration(*interval));
    }
    if (live && terminal && !args.connection.json())
      frame = "\x1b[H\x1b[2J" + frame;  // home, clear: redraw in place
    else if (live && !args.connection.json())
      frame += "\n";  // frames one after another, for a pipe
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    std::fflush(stdout);
    if (!live) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(*interval));
  }
}

// The secret of an answer that made a token; the exit code instead when there is nothing more
// to do (a failure, or -o json, which prints the answer whole).
std::optional<int> TakeSecret(const ApiResult& answer, const ClusterArgs& args,
                              std::string& secret) {
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  secret = answer.body.value("token", "");
  if (secret.empty()) return Fail("the server's answer has no token");
  return std::nullopt;
}

int RunTokenCreate(const ClusterArgs& args, const Client& client) {
  json request = {{"user", args.user}, {"team", args.team}, {"role", args.role}};
  if (!args.scope.empty()) request["scope"] = args.scope;
  if (!args.expires_in.empty()) request["expires_in"] = args.expires_in;
  ApiResult answer = client.Post("/tokens", request);
  std::string secret;
  if (auto done = TakeSecret(answer, args, secret)) return *done;
  api::TokenInfo info;
  try {
    info = answer.body.at("info").get<api::TokenInfo>();
  } catch (const std::exception&) {
    info.user = args.user;
    info.team = args.team;
  }
  // The secret alone on stdout, so TOKEN=$(gpufleet token create ...) works; the rest on stderr.
  fmt::print(stderr, "created token {} for {} (team {}, role {}, scope {}, {}):\n", info.id,
             info.user, info.team, api::RoleName(info.role), info.scope,
             info.expires_ms ? "expires " + FormatTime(info.expires_ms) : std::string("no expiry"));
  std::fflush(stderr);
  fmt::print("{}\n", secret);
  std::fflush(stdout);
  fmt::print(stderr,
             "warning: this is the only time the secret is shown (the server keeps only its "
             "hash); store it now.\nuse it with: export GPUFLEET_TOKEN={}   (or --token)\n",
             secret);
  return 0;
}

int RunTokenList(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Get("/tokens");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto tokens = ListOf<api::TokenInfo>(answer, "tokens");
  if (!tokens) return kExitFailure;
  Table table({{"ID"},
               {"USER"},
               {"TEAM"},
               {"ROLE"},
               {"SCOPE"},
               {"CREATED"},
               {"CREATED-BY"},
               {"EXPIRES"},
               {"ROTATED-TO"}});
  for (const api::TokenInfo& token : *tokens)
    table.Add({token.id, token.user, token.team, std::string(api::RoleName(token.role)),
               token.scope, FormatTime(token.created_ms),
               token.created_by.empty() ? "-" : token.created_by,
               token.expires_ms ? FormatTime(token.expires_ms) : "never",
               token.rotated_to.empty() ? "-" : token.rotated_to});
  fmt::print("{}", table.Render());
  return 0;
}

int RunTokenRevoke(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Call("DELETE", fmt::format("/tokens/{}", UrlEncode(args.name)));
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body.is_null() ? json{{"id", args.name}, {"revoked", true}} : answer.body);
    return 0;
  }
  fmt::print("token {} revoked\n", args.name);
  return 0;
}

int RunTokenRotate(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Post(fmt::format("/tokens/{}/rotate", UrlEncode(args.name)),
                                 json{{"overlap", args.overlap}});
  std::string secret;
  if (auto done = TakeSecret(answer, args, secret)) return *done;
  api::TokenInfo next;
  api::TokenInfo previous;
  try {
    next = answer.body.at("info").get<api::TokenInfo>();
    previous = answer.body.at("previous").get<api::TokenInfo>();
  } catch (const std::exception& error) {
    return Fail(fmt::format("unexpected answer from the server: {}", error.what()));
  }
  // As `token create`: the secret alone on stdout.
  fmt::print(stderr, "token {} replaces {} (user {}, role {}, scope {}); {} works until {}:\n",
             next.id, previous.id, next.user, api::RoleName(next.role), next.scope, previous.id,
             FormatTime(previous.expires_ms));
  std::fflush(stderr);
  fmt::print("{}\n", secret);
  std::fflush(stdout);
  fmt::print(stderr, "warning: this is the only time the secret is shown; deploy it before {}.\n",
             FormatTime(previous.expires_ms));
  return 0;
}

int RunWhoami(const ClusterArgs& args, const Client& client) {
  ApiResult answer = client.Get("/whoami");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  api::TokenInfo info;
  try {
    info = answer.body.get<api::TokenInfo>();
  } catch (const std::exception& error) {
    return Fail(fmt::format("unexpected answer from the server: {}", error.what()));
  }
  fmt::print("{} (team {}, role {})\n", info.user, info.team.empty() ? "-" : info.team,
             api::RoleName(info.role));
  fmt::print("token   {} (from {})\n", info.id, client.config().token_source);
  fmt::print("server  {} (from {})\n", client.config().server, client.config().server_source);
  return 0;
}

int RunAudit(const ClusterArgs& args, const Client& client) {
  if (args.limit < 0) {
    fmt::print(stderr, "error: --limit must be positive\n");
    return kExitUsage;
  }
  ApiResult answer =
      client.Get(args.limit > 0 ? fmt::format("/audit?limit={}", args.limit) : "/audit");
  if (!answer.ok()) return Fail(answer.message);
  if (args.connection.json()) {
    PrintJson(answer.body);
    return 0;
  }
  auto entries = ListOf<api::AuditEntry>(answer, "entries");
  if (!entries) return kExitFailure;
  Table table({{"TIME"}, {"USER"}, {"TOKEN"}, {"ACTION"}, {"TARGET"}, {"DETAIL", 60}});
  for (const api::AuditEntry& entry : *entries)
    table.Add({FormatTime(entry.time_ms), entry.user, entry.token_id, entry.action, entry.target,
               entry.detail});
  fmt::print("{}", table.Render());
  return 0;
}

}  // namespace

std::string NodesTable(const std::vector<api::NodeRecord>& nodes, TimeMs now_ms) {
  Table table({{"NAME"},
               {"STATE"},
               {"GPUS"},
               {"MODEL", 32},
               {"BACKEND"},
               {"CPU", 0, true},
               {"MEM", 0, true},
               {"LAST-SEEN"}});
  for (const api::NodeRecord& node : nodes) {
    const api::NodeReport& report = node.report;
    std::string gpus = fmt::format("{}/{}", UsedGpus(node), report.gpus.size());
    const auto unhealthy = std::count_if(report.gpus.begin(), report.gpus.end(),
                                         [](const api::GpuStatus& gpu) { return !gpu.healthy; });
    if (unhealthy > 0) gpus += fmt::format(" ({} unhealthy)", unhealthy);
    table.Add({report.name, NodeState(node), gpus, GpuModels(report),
               report.backend.empty() ? "-" : report.backend, FormatCpu(report.cpu_milli),
               FormatMemory(report.memory_mib), FormatAge(node.last_seen_ms, now_ms)});
  }
  return table.Render();
}

std::string TopFrame(const std::vector<api::NodeRecord>& nodes,
                     const std::vector<api::QueueStatus>& queues, const std::string& server,
                     TimeMs now_ms, size_t max_rows) {
  std::vector<const api::NodeRecord*> sorted;
  for (const api::NodeRecord& node : nodes)
    sorted.push_back(&node);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->report.name < b->report.name; });

  size_t ready = 0, draining = 0, lost = 0, gpus = 0, used = 0, unhealthy = 0;
  double utilization = 0;
  for (const api::NodeRecord* node : sorted) {
    ready += node->state == api::NodeState::kReady;
    draining += node->state == api::NodeState::kDraining;
    lost += node->state == api::NodeState::kLost;
    gpus += node->report.gpus.size();
    used += UsedGpus(*node);
    for (const api::GpuStatus& gpu : node->report.gpus) {
      unhealthy += !gpu.healthy;
      utilization += gpu.utilization_pct;
    }
  }
  int64_t pending = 0, running = 0;
  MilliGpu gpus_pending = 0;
  for (const api::QueueStatus& queue : queues) {
    pending += queue.pending;
    running += queue.running;
    gpus_pending += queue.gpu_milli_pending;
  }
  std::string out = fmt::format("gpufleet top - {} - {}\n", server, FormatTime(now_ms));
  out += fmt::format(
      "nodes: {} ({} ready, {} draining, {} lost)   GPUs: {} ({} in use, {} "
      "unhealthy), mean utilization {:.0f}%\n",
      sorted.size(), ready, draining, lost, gpus, used, unhealthy,
      gpus > 0 ? utilization / static_cast<double>(gpus) : 0.0);
  out += fmt::format("jobs: {} running, {} pending (asking for {} GPUs) in {} queue(s)\n\n",
                     running, pending, api::FormatGpus(gpus_pending), queues.size());

  Table table({{"NODE"},
               {"GPU", 0, true},
               {"MODEL"},
               {"UTIL", 0, true},
               {"MEMORY", 0, true},
               {"TEMP", 0, true},
               {"POWER", 0, true},
               {"HEALTH", 40},
               {"JOBS", 30}});
  size_t shown = 0;
  size_t total = 0;
  for (const api::NodeRecord* node : sorted) {
    std::string name = node->report.name;
    if (node->state != api::NodeState::kReady)
      name += fmt::format(" [{}]", api::NodeStateName(node->state));
    for (const api::GpuStatus& gpu : node->report.gpus) {
      ++total;
      if (max_rows > 0 && shown >= max_rows) continue;
      ++shown;
      auto holders = node->gpu_jobs.find(gpu.index);
      table.Add({name, std::to_string(gpu.index), gpu.model,
                 fmt::format("{:.0f}%", gpu.utilization_pct), GpuMemory(gpu),
                 fmt::format("{:.0f}C", gpu.temperature_c), fmt::format("{:.0f}W", gpu.power_w),
                 gpu.healthy ? "ok"
                             : (gpu.health_reason.empty() ? "UNHEALTHY"
                                                          : "UNHEALTHY: " + gpu.health_reason),
                 holders == node->gpu_jobs.end() ? "-" : JobIds(holders->second)});
    }
  }
  if (total == 0) return out + "(no GPUs: no node has registered yet)\n";
  out += table.Render();
  if (shown < total)
    out +=
        fmt::format("... {} more GPU(s) below; enlarge the window or use --once\n", total - shown);
  return out;
}

void AddClusterCommands(CLI::App& app, ClusterArgs& args) {
  args.nodes = app.add_subcommand("nodes", "List nodes; 'nodes drain NAME', 'nodes undrain NAME'");
  args.nodes->require_subcommand(0, 1);
  AddConnectionOptions(*args.nodes, args.connection);
  args.drain = args.nodes->add_subcommand(
      "drain", "Admin: place no new jobs on a node (running jobs go on)");
  args.drain->add_option("name", args.name, "Node name")->required();
  AddConnectionOptions(*args.drain, args.connection);
  args.undrain = args.nodes->add_subcommand("undrain", "Admin: let a drained node take jobs again");
  args.undrain->add_option("name", args.name, "Node name")->required();
  AddConnectionOptions(*args.undrain, args.connection);

  args.queues = app.add_subcommand("queues", "Per queue: pending and running jobs and GPUs");
  AddConnectionOptions(*args.queues, args.connection);

  args.top = app.add_subcommand(
      "top", "Live per-GPU view of the cluster: utilization, memory, health, jobs");
  args.top->add_flag("--once", args.once, "Print one frame and exit (for scripts)");
  args.top->add_option("--interval", args.interval, "Refresh interval")->capture_default_str();
  AddConnectionOptions(*args.top, args.connection);

  args.token = app.add_subcommand("token", "Admin: API tokens: token create, list, rotate, revoke");
  args.token->require_subcommand(1);
  args.token_create =
      args.token->add_subcommand("create", "Create a token; its secret is printed once, here only");
  args.token_create->add_option("--user", args.user, "Who uses it")->required();
  args.token_create->add_option("--team", args.team, "The team whose jobs it sees")->required();
  args.token_create->add_option("--role", args.role, "admin, user or agent")
      ->required()
      ->check(CLI::IsMember({"admin", "user", "agent", "gateway"}));
  args.token_create->add_option("--scope", args.scope,
                                "read (GET only), submit, or admin (default: admin for admins, "
                                "submit for users)");
  args.token_create->add_option("--expires-in", args.expires_in,
                                "Refuse the token after this long (30d, 12h; default: never)");
  AddConnectionOptions(*args.token_create, args.connection);
  args.token_list = args.token->add_subcommand("list", "List tokens (never their secrets)");
  AddConnectionOptions(*args.token_list, args.connection);
  args.token_revoke = args.token->add_subcommand("revoke", "Revoke a token by its id (tok-...)");
  args.token_revoke->add_option("id", args.name, "Token id, as 'token list' shows")->required();
  AddConnectionOptions(*args.token_revoke, args.connection);
  args.token_rotate = args.token->add_subcommand(
      "rotate", "Replace a token with a new secret; the old one works for --overlap more");
  args.token_rotate->add_option("id", args.name, "Token id, as 'token list' shows")->required();
  args.token_rotate->add_option("--overlap", args.overlap, "How long the old secret still works")
      ->capture_default_str();
  AddConnectionOptions(*args.token_rotate, args.connection);

  args.whoami = app.add_subcommand("whoami", "Show who the token is: user, team, role");
  AddConnectionOptions(*args.whoami, args.connection);

  args.usage = app.add_subcommand(
      "usage", "GPU-hours per team (or user) over a period; users see their own team");
  args.usage->add_option("--since", args.since, "From: 7d, 24h (back from now) or 2026-12-01")
      ->capture_default_str();
  args.usage->add_option("--until", args.until, "To (default: now), as --since");
  args.usage->add_option("--by", args.by, "team, or user (per user within each team)")
      ->check(CLI::IsMember({"team", "user"}))
      ->capture_default_str();
  AddConnectionOptions(*args.usage, args.connection);

  args.audit = app.add_subcommand("audit", "Admin: the audit log of every change, newest first");
  args.audit->add_option("--limit", args.limit, "At most this many entries");
  AddConnectionOptions(*args.audit, args.connection);
}

std::optional<int> RunClusterCommands(const ClusterArgs& args) {
  if (!*args.nodes && !*args.queues && !*args.top && !*args.token && !*args.whoami &&
      !*args.audit && !*args.usage)
    return std::nullopt;
  auto client = Client::FromArgs(args.connection);
  if (!client) return kExitFailure;
  if (*args.drain) return RunDrain(args, *client, true);
  if (*args.undrain) return RunDrain(args, *client, false);
  if (*args.nodes) return RunNodes(args, *client);
  if (*args.queues) return RunQueues(args, *client);
  if (*args.top) return RunTop(args, *client);
  if (*args.token_create) return RunTokenCreate(args, *client);
  if (*args.token_list) return RunTokenList(args, *client);
  if (*args.token_revoke) return RunTokenRevoke(args, *client);
  if (*args.token_rotate) return RunTokenRotate(args, *client);
  if (*args.whoami) return RunWhoami(args, *client);
  if (*args.usage) return RunUsage(args, *client);
  return RunAudit(args, *client);
}

}  // namespace gpufleet::cli
