// The control plane through its HTTP API: a real Server on a loopback port with a temporary data
// dir (server_test_fixture.h).

#include <future>
#include <thread>

#include "server_test_fixture.h"

namespace gpufleet::server {
namespace {

using namespace test_support;
using namespace std::chrono_literals;
using api::JobRecord;
using api::JobState;
using nlohmann::json;

const json kOneGpu = {{"command", {"python3", "train.py"}}, {"gpus", 1}};

// ---- Jobs, bad input ---------------------------------------------------------------------------

TEST_F(ServerTest, SubmittedJobIsVisibleAndWaitsForNodes) {
  const JobId id = Submit(alice_, {{"name", "train"},
                                   {"command", {"python3", "train.py"}},
                                   {"gpus", 2},
                                   {"env", {{"SEED", "1"}}}});
  ASSERT_NE(id, 0u);
  const JobRecord job = Job(id, alice_);
  EXPECT_EQ(job.user, "alice");
  EXPECT_EQ(job.team, "vision");
  EXPECT_EQ(job.spec.name, "train");
  EXPECT_EQ(job.spec.gpu_milli_per_task, 2000);
  EXPECT_EQ(job.state, JobState::kPending);
  EXPECT_EQ(job.reason, "no nodes are ready");
  ASSERT_EQ(job.events.size(), 1u);
  EXPECT_EQ(job.events[0].to, "pending");

  const JobId second = Submit(alice_, kOneGpu);
  EXPECT_EQ(second, id + 1);
  EXPECT_EQ(Job(second).spec.name, "python3");  // unnamed: the command's first word
  const json list = Call("GET", "/api/v1/jobs", alice_).Json().at("jobs");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].at("id"), second);  // newest first
  EXPECT_EQ(Call("GET", "/api/v1/jobs?state=running", alice_).Json().at("jobs").size(), 0u);
  EXPECT_EQ(Call("GET", "/api/v1/jobs?limit=1", alice_).Json().at("jobs").size(), 1u);
  EXPECT_EQ(Call("GET", "/api/v1/jobs?state=sleeping", alice_).status, 400);
  EXPECT_EQ(Call("GET", "/api/v1/jobs?limit=0", alice_).status, 400);
  EXPECT_EQ(Call("GET", "/api/v1/jobs?limit=10001", alice_).status, 400);
}

TEST_F(ServerTest, BadInputIsRefusedPreciselyAndNothingIsWritten) {
  Sync(NodeReport("n1", 4));
  const size_t audit_before = AuditActions().size();

  Reply reply = Call("POST", "/api/v1/jobs", alice_, R"({"command": ["x"], "gpu": 1})");
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.Json().at("error").get<std::string>().find("unknown field 'gpu'"),
            std::string::npos)
      << reply.body;
  reply = Call("POST", "/api/v1/jobs", alice_, R"({"command": ["x"], )");
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("malformed JSON"), std::string::npos) << reply.body;
  reply = Call("POST", "/api/v1/jobs", alice_, R"({"gpus": 1})");
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("'command' is required"), std::string::npos) << reply.body;

  // More GPUs per task than any node has: can never run here.
  reply = Call("POST", "/api/v1/jobs", alice_, R"({"command": ["x"], "gpus": 8})");
  EXPECT_EQ(reply.status, 422);
  EXPECT_NE(reply.body.find("can never run"), std::string::npos) << reply.body;
  reply = Call("POST", "/api/v1/jobs", alice_, R"({"command": ["x"], "gpu_model": "A100-40GB"})");
  EXPECT_EQ(reply.status, 422) << reply.body;

  EXPECT_EQ(Call("GET", "/api/v1/jobs/abc", alice_).status, 400);
  EXPECT_EQ(Call("GET", "/api/v1/jobs/99999999999999999999999", alice_).status, 400);
  EXPECT_EQ(Call("GET", "/api/v1/jobs/42", alice_).status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/jobs/42/cancel", alice_).status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/jobs", alice_, std::string(2 << 20, ' ')).status, 413);
  EXPECT_EQ(Call("POST", "/api/v1/tokens", admin_, R"({"user": "x", "rol": "user"})").status, 400);
  EXPECT_EQ(Call("POST", "/api/v1/tokens", admin_, R"({"user": "x", "role": "god"})").status, 400);
  EXPECT_EQ(Call("POST", "/api/v1/tokens", admin_, R"({"user": "x", "role": "user"})").status,
            400);  // a user token needs a team
  EXPECT_EQ(Call("POST", "/api/v1/agents/sync", agent_, R"({"node": {"name": "a/b"}})").status,
            400);

  // Limits: each refused with what and how much, under the 1 MiB body limit.
  auto refused = [&](const json& job, const std::string& says) {
    const Reply answer = Call("POST", "/api/v1/jobs", alice_, job.dump());
    EXPECT_EQ(answer.status, 400) << answer.body;
    EXPECT_NE(answer.body.find(says), std::string::npos) << answer.body;
  };
  refused({{"command", std::vector<std::string>(5000, "x")}}, "'command' has 5000 items");
  refused({{"command", {"x", std::string(40000, 'a')}}}, "'command[1]' is 40000 bytes");
  json many_env = json::object();
  for (int i = 0; i < 1100; ++i)
    many_env[fmt::format("V{}", i)] = "1";
  refused({{"command", {"x"}}, {"env", many_env}}, "'env' has 1100 variables");
  refused({{"command", {"x"}}, {"env", {{"BIG", std::string(40000, 'b')}}}}, "'env.BIG' is");
  refused({{"command", {"x"}}, {"env", {{std::string(300, 'N'), "1"}}}}, "invalid variable name");
  reply = Call("POST", "/api/v1/jobs", alice_, std::string(100, '[') + std::string(100, ']'));
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("deeper than 32 levels"), std::string::npos) << reply.body;
  // A number past double's range was a 500 (found by tests/fuzz/fuzz_api_json).
  reply = Call("POST", "/api/v1/jobs", alice_, R"({"command": ["x"], "gpus": 1e99999})");
  EXPECT_EQ(reply.status, 400) << reply.body;
  EXPECT_NE(reply.body.find("malformed JSON"), std::string::npos) << reply.body;

  EXPECT_EQ(JobCount(), 0u);
  EXPECT_EQ(AuditActions().size(), audit_before);
}

// ---- Auth ---------------------------------------------------------------------------------------

TEST_F(ServerTest, TokensRolesAndTeams) {
  Reply reply = Call("GET", "/api/v1/jobs", "");
  EXPECT_EQ(reply.status, 401);
  EXPECT_EQ(reply.raw.Header("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(Call("GET", "/api/v1/jobs", "gpf_" + std::string(64, '0')).status, 401);
  EXPECT_EQ(Call("GET", "/api/v1/jobs", "nonsense").status, 401);
  EXPECT_EQ(Call("GET", "/healthz", "").status, 200);
  EXPECT_EQ(Call("GET", "/readyz", "").status, 200);

  const json me = Call("GET", "/api/v1/whoami", alice_).Json();
  EXPECT_EQ(me.at("user"), "alice");
  EXPECT_EQ(me.at("team"), "vision");
  EXPECT_EQ(me.at("role"), "user");

  const JobId speech = Submit(bob_, kOneGpu);
  // Another team's job does not exist for alice, whatever she tries.
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}", speech), alice_).status, 404);
  EXPECT_EQ(Call("POST", fmt::format("/api/v1/jobs/{}/cancel", speech), alice_).status, 404);
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}/logs", speech), alice_).status, 404);
  EXPECT_EQ(Call("GET", "/api/v1/jobs", alice_).Json().at("jobs").size(), 0u);
  EXPECT_EQ(Job(speech, bob_).state, JobState::kPending);
  EXPECT_EQ(Call("GET", "/api/v1/jobs", admin_).Json().at("jobs").size(), 1u);

  Sync(NodeReport("n1"));
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/drain", alice_).status, 403);
  EXPECT_EQ(Call("GET", "/api/v1/tokens", alice_).status, 403);
  EXPECT_EQ(Call("GET", "/api/v1/audit", alice_).status, 403);
  EXPECT_EQ(Call("POST", "/api/v1/agents/sync", alice_, json(api::SyncRequest{}).dump()).status,
            403);
  EXPECT_EQ(Call("GET", "/api/v1/jobs", agent_).status, 403);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n9/drain", admin_).status, 404);
  reply = Call("POST", "/api/v1/nodes/n1/drain", admin_);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.Json().at("state"), "draining");
  EXPECT_EQ(Call("GET", "/api/v1/nodes", alice_).Json().at("nodes")[0].at("drained"), true);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/undrain", admin_).Json().at("state"), "ready");

  // Secrets are never listed; a revoked token stops working at once.
  const std::string tokens = Call("GET", "/api/v1/tokens", admin_).body;
  EXPECT_EQ(tokens.find(alice_), std::string::npos);
  EXPECT_EQ(tokens.find("sha256"), std::string::npos);
  EXPECT_EQ(Call("DELETE", "/api/v1/tokens/" + me.at("id").get<std::string>(), admin_).status, 200);
  EXPECT_EQ(Call("GET", "/api/v1/whoami", alice_).status, 401);
  EXPECT_EQ(Call("DELETE", "/api/v1/tokens/tok-00000000", admin_).status, 404);
}

// A queue that names its teams takes their jobs (and admins') only; others get 403, store nothing.
TEST_F(ServerTest, AQueueThatNamesItsTeamsRefusesOtherTeams) {
  sched::QueueConfig speech;
  speech.name = "speech";
  speech.guaranteed_milli = 4 * kMilliPerGpu;
  speech.teams = {"speech"};
  sched::QueueConfig shared;
  shared.name = "default";
  options_.scheduler.queues = {speech, shared};
  Restart();
  json job = kOneGpu;
  job["queue"] = "speech";
  const size_t audit_before = AuditActions().size();
  Reply reply = Call("POST", "/api/v1/jobs", alice_, job.dump());
  EXPECT_EQ(reply.status, 403) << reply.body;
  EXPECT_NE(reply.body.find("queue 'speech' is for team(s) speech; team 'vision' may not submit"),
            std::string::npos)
      << reply.body;
  json deployment = {{"name", "asr"},     {"command", {"python3", "serve.py"}},
                     {"gpus", 1},         {"min_replicas", 0},
                     {"max_replicas", 1}, {"queue", "speech"}};
  reply = Call("POST", "/api/v1/deployments", alice_, deployment.dump());
  EXPECT_EQ(reply.status, 403) << reply.body;
  EXPECT_EQ(JobCount(), 0u);
  EXPECT_TRUE(Call("GET", "/api/v1/deployments", admin_).Json().at("deployments").empty());
  EXPECT_EQ(AuditActions().size(), audit_before);

  EXPECT_NE(Submit(bob_, job), 0);
  EXPECT_NE(Submit(admin_, job), 0);
  EXPECT_NE(Submit(alice_, kOneGpu), 0);  // the default queue names no team
  EXPECT_EQ(Call("POST", "/api/v1/deployments", bob_, deployment.dump()).status, 201);
  const json queues = Call("GET", "/api/v1/queues", alice_).Json().at("queues");
  ASSERT_EQ(queues.size(), 2u);
  EXPECT_EQ(queues[1].at("name"), "speech");
  EXPECT_EQ(queues[1].at("teams"), json::array({"speech"}));
  EXPECT_EQ(queues[0].at("teams"), json::array());
}

TEST_F(ServerTest, TokenScopesExpiryAndRotation) {
  auto create = [&](const json& request) {
    return Call("POST", "/api/v1/tokens", admin_, request.dump());
  };
  // Scopes: read changes nothing, submit does no admin work, admin needs the admin role.
  Reply reply = create({{"user", "viewer"}, {"team", "vision"}, {"scope", "read"}});
  ASSERT_EQ(reply.status, 201) << reply.body;
  const std::string viewer = reply.Json().at("token");
  EXPECT_EQ(reply.Json().at("info").at("scope"), "read");
  EXPECT_EQ(Call("GET", "/api/v1/jobs", viewer).status, 200);
  reply = Call("POST", "/api/v1/jobs", viewer, json(kOneGpu).dump());
  EXPECT_EQ(reply.status, 403);
  EXPECT_NE(reply.body.find("read-only"), std::string::npos) << reply.body;
  EXPECT_EQ(Call("GET", "/api/v1/jobs", admin_).Json().at("jobs").size(), 0u);
  reply = create({{"user", "ops"}, {"team", "ops"}, {"role", "admin"}, {"scope", "submit"}});
  ASSERT_EQ(reply.status, 201) << reply.body;
  const std::string operator_token = reply.Json().at("token");
  EXPECT_NE(Submit(operator_token, kOneGpu), 0);
  EXPECT_EQ(Call("GET", "/api/v1/tokens", operator_token).status, 403);
  reply = create({{"user", "auditor"}, {"team", "ops"}, {"role", "admin"}, {"scope", "read"}});
  const std::string auditor = reply.Json().at("token");
  EXPECT_EQ(Call("GET", "/api/v1/audit", auditor).status, 200);
  EXPECT_EQ(Call("DELETE", "/api/v1/tokens/tok-00000000", auditor).status, 403);
  EXPECT_EQ(create({{"user", "x"}, {"team", "t"}, {"scope", "admin"}}).status, 400);
  EXPECT_EQ(create({{"user", "x"}, {"team", "t"}, {"scope", "write"}}).status, 400);
  EXPECT_EQ(create({{"user", "x"}, {"team", "t"}, {"expires_in", "soon"}}).status, 400);
  EXPECT_EQ(create({{"user", "x"}, {"team", "t"}, {"expires_in", "100000d"}}).status, 400);
  EXPECT_EQ(create({{"user", "x"}, {"team", "t"}, {"expires_in", -5}}).status, 400);

  // Expiry: refused with the reason once past.
  reply = create({{"user", "brief"}, {"team", "vision"}, {"expires_in", "1s"}});
  ASSERT_EQ(reply.status, 201) << reply.body;
  const std::string brief = reply.Json().at("token");
  EXPECT_GT(reply.Json().at("info").at("expires_ms").get<int64_t>(), 0);
  EXPECT_EQ(Call("GET", "/api/v1/whoami", brief).status, 200);
  ASSERT_TRUE(WaitUntil([&] { return Call("GET", "/api/v1/whoami", brief).status == 401; }));
  reply = Call("GET", "/api/v1/whoami", brief);
  EXPECT_NE(reply.body.find("expired at"), std::string::npos) << reply.body;

  // Rotation: the new secret works at once, the old one until the overlap ends; both survive a
  // restart; a second rotation of the old one is refused.
  const std::string alice_id = Call("GET", "/api/v1/whoami", alice_).Json().at("id");
  reply = Call("POST", "/api/v1/tokens/" + alice_id + "/rotate", admin_,
               json{{"overlap", "2s"}}.dump());
  ASSERT_EQ(reply.status, 201) << reply.body;
  const std::string rotated = reply.Json().at("token");
  const std::string rotated_id = reply.Json().at("info").at("id");
  EXPECT_EQ(reply.Json().at("previous").at("rotated_to"), rotated_id);
  const json me = Call("GET", "/api/v1/whoami", rotated).Json();
  EXPECT_EQ(me.at("user"), "alice");
  EXPECT_EQ(me.at("team"), "vision");
  EXPECT_EQ(me.at("scope"), "submit");
  EXPECT_EQ(Call("GET", "/api/v1/whoami", alice_).status, 200);
  EXPECT_EQ(Call("POST", "/api/v1/tokens/" + alice_id + "/rotate", admin_, "").status, 409);
  EXPECT_EQ(Call("POST", "/api/v1/tokens/tok-00000000/rotate", admin_, "").status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/tokens/" + rotated_id + "/rotate", admin_,
                 json{{"overlap", "1s"}, {"extra", 1}}.dump())
                .status,
            400);
  Restart();
  EXPECT_EQ(Call("GET", "/api/v1/whoami", rotated).status, 200);
  ASSERT_TRUE(WaitUntil([&] { return Call("GET", "/api/v1/whoami", alice_).status == 401; }));
  reply = Call("GET", "/api/v1/whoami", alice_);
  EXPECT_NE(reply.body.find("rotated: use " + rotated_id), std::string::npos) << reply.body;
  EXPECT_EQ(Call("GET", "/api/v1/whoami", rotated).status, 200);
  const std::string audit = Call("GET", "/api/v1/audit", admin_).body;
  EXPECT_NE(audit.find("token.rotate"), std::string::npos);
}

class RateLimitTest : public ServerTest {
 protected:
  void SetUp() override {
    options_.token_rate_limit = 5;  // bursts of 10
    Start();
  }
};

TEST_F(RateLimitTest, APersonsTokenOverItsRateGets429WithRetryAfterAndOthersGoOn) {
  int answered = 0;
  Reply refused;
  for (int i = 0; i < 30; ++i) {
    Reply reply = Call("GET", "/api/v1/jobs", alice_);
    if (reply.status == 200) {
      ++answered;
    } else {
      refused = reply;
      break;
    }
  }
  // The burst (10, plus what refilled meanwhile), then a refusal that says when to come back.
  EXPECT_GE(answered, 10);
  EXPECT_LT(answered, 30);
  EXPECT_EQ(refused.status, 429);
  EXPECT_NE(refused.body.find("rate limit of 5 requests/s"), std::string::npos) << refused.body;
  EXPECT_EQ(refused.raw.Header("Retry-After"), "1");
  // A refused submission stores nothing. Right after the refusal: the bucket refills one
  // request per 200 ms, which the slower calls below (under ASan) would give it.
  EXPECT_EQ(Call("POST", "/api/v1/jobs", alice_, kOneGpu.dump()).status, 429);
  EXPECT_EQ(JobCount(), 0u);
  // Each token has its own bucket; admins and agents are not limited.
  EXPECT_EQ(Call("GET", "/api/v1/jobs", bob_).status, 200);
  for (int i = 0; i < 30; ++i)
    ASSERT_EQ(Call("GET", "/api/v1/jobs", admin_).status, 200);
  for (int i = 0; i < 30; ++i)
    ASSERT_EQ(Call("POST", "/api/v1/agents/sync", agent_, json(api::SyncRequest{}).dump()).status,
              400);  // refused for its content, not its rate
  // After a pause the token works again.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(Call("GET", "/api/v1/jobs", alice_).status, 200);
}

// ---- Scheduling, agents, the lifecycle
// ------------------------------------------------------------

TEST_F(ServerTest, GangIsPlacedAcrossNodesAndRunsToSuccess) {
  const api::NodeReport n1 = NodeReport("n1"), n2 = NodeReport("n2");
  Sync(n1);
  Sync(n2);
  const JobId id = Submit(alice_, {{"command", {"torchrun", "train.py"}},
                                   {"tasks", 2},
                                   {"gpus", 4},
                                   {"env", {{"SEED", "1"}, {"WORLD_SIZE", "64"}}}});
  ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
  const JobRecord placed = Job(id);
  ASSERT_EQ(placed.tasks.size(), 2u);
  EXPECT_NE(placed.tasks[0].node, placed.tasks[1].node);
  EXPECT_EQ(placed.tasks[0].gpu_indices.size(), 4u);
  EXPECT_EQ(placed.tasks[0].gpu_uuids.size(), 4u);
  EXPECT_EQ(placed.tasks[0].workload_id, fmt::format("j{}-r0-a0", id));

  const api::NodeReport& rank0 = placed.tasks[0].node == "n1" ? n1 : n2;
  const api::NodeReport& rank1 = placed.tasks[0].node == "n1" ? n2 : n1;
  const api::SyncResponse d0 = Sync(rank0);
  const api::SyncResponse d1 = Sync(rank1);
  const api::TaskLaunch* t0 = Find(d0, id);
  const api::TaskLaunch* t1 = Find(d1, id);
  ASSERT_TRUE(t0 && t1);
  EXPECT_EQ(t0->rank, 0);
  EXPECT_EQ(t1->rank, 1);
  EXPECT_EQ(t0->argv, (std::vector<std::string>{"torchrun", "train.py"}));
  for (const api::TaskLaunch* launch : {t0, t1}) {
    EXPECT_EQ(launch->env.at("MASTER_ADDR"), rank0.address);
    EXPECT_EQ(launch->env.at("MASTER_PORT"), std::to_string(20000 + id % 10000));
    EXPECT_EQ(launch->env.at("WORLD_SIZE"), "2");  // the gang's, not the job's 64
    EXPECT_EQ(launch->env.at("GPUFLEET_NNODES"), "2");
    EXPECT_EQ(launch->env.at("GPUFLEET_JOB_ID"), std::to_string(id));
    EXPECT_EQ(launch->env.at("LOCAL_RANK"), "0");
    EXPECT_EQ(launch->env.at("SEED"), "1");
  }
  EXPECT_EQ(t1->env.at("RANK"), "1");
  EXPECT_EQ(t1->env.at("NODE_RANK"), "1");
  EXPECT_EQ(t1->gpu_indices, placed.tasks[1].gpu_indices);

  Sync(rank0, {Report(*t0, "running")}, d0.version);
  EXPECT_EQ(Job(id).state, JobState::kStarting);
  Sync(rank1, {Report(*t1, "running")}, d1.version);
  const JobRecord running = Job(id);
  EXPECT_EQ(running.state, JobState::kRunning);
  EXPECT_GT(running.started_ms, 0);
  EXPECT_EQ(Call("GET", "/api/v1/nodes", alice_).Json().at("nodes")[0].at("gpu_jobs").size(), 4u);

  Sync(rank0, {Report(*t0, "exited", 0)}, d0.version);
  Sync(rank1, {Report(*t1, "exited", 0)}, d1.version);
  const JobRecord done = Job(id);
  EXPECT_EQ(done.state, JobState::kSucceeded);
  EXPECT_EQ(done.exit_code, 0);
  std::vector<std::string> path;
  for (const api::JobEvent& event : done.events)
    path.push_back(event.to);
  EXPECT_EQ(path,
            (std::vector<std::string>{"pending", "scheduled", "starting", "running", "succeeded"}));
  EXPECT_EQ(Find(Sync(rank0), id), nullptr);  // nothing left to run
}

TEST_F(ServerTest, FailedTaskFailsTheGangAndStopsTheOtherTask) {
  Sync(NodeReport("n1"));
  Sync(NodeReport("n2"));
  const JobId id = Submit(alice_, {{"command", {"x"}}, {"tasks", 2}, {"gpus", 4}});
  ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
  const JobRecord placed = Job(id);
  const api::NodeReport rank0 = NodeReport(placed.tasks[0].node);
  const api::NodeReport rank1 = NodeReport(placed.tasks[1].node);
  const api::SyncResponse d0 = Sync(rank0);
  const api::SyncResponse d1 = Sync(rank1);
  ASSERT_TRUE(Find(d0, id) && Find(d1, id));
  Sync(rank0, {Report(*Find(d0, id), "running")}, d0.version);
  Sync(rank1, {Report(*Find(d1, id), "exited", 3)}, d1.version);

  const JobRecord failed = Job(id);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.reason, fmt::format("task 1 on node {} exited with code 3", rank1.name));
  EXPECT_EQ(failed.exit_code, 3);
  // Rank 0's node must stop its task: it is no longer desired, and its version moved on.
  const api::SyncResponse after = Sync(rank0, {Report(*Find(d0, id), "running")}, d0.version);
  EXPECT_EQ(Find(after, id), nullptr);
  EXPECT_NE(after.version, d0.version);
  EXPECT_EQ(Call("POST", fmt::format("/api/v1/jobs/{}/cancel", id), alice_).status, 409);
}

TEST_F(ServerTest, CancelRemovesTheJobFromDesired) {
  Sync(NodeReport("n1"));
  const JobId id = Submit(alice_, kOneGpu);
  ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
  const api::SyncResponse before = Sync(NodeReport("n1"));
  ASSERT_NE(Find(before, id), nullptr);
  const Reply reply = Call("POST", fmt::format("/api/v1/jobs/{}/cancel", id), alice_);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.Json().at("state"), "cancelled");
  EXPECT_EQ(reply.Json().at("reason"), "cancelled by alice");
  const api::SyncResponse after = Sync(NodeReport("n1"));
  EXPECT_EQ(Find(after, id), nullptr);
  EXPECT_NE(after.version, before.version);
  EXPECT_EQ(Call("POST", fmt::format("/api/v1/jobs/{}/cancel", id), alice_).status, 409);
}

TEST_F(ServerTest, LongPollReturnsWhenAJobIsPlaced) {
  const api::SyncResponse first = Sync(NodeReport("n1"));
  EXPECT_TRUE(first.desired.empty());
  // Held until something changes: the heartbeat is 60 s, past this call's own 30 s timeout, so
  // only a wake-up can answer it in time.
  auto poll = std::async(std::launch::async,
                         [&] { return Sync(NodeReport("n1"), {}, first.version, 60000, 30s); });
  // A sync that is already current and asks not to wait is answered at once.
  EXPECT_EQ(Sync(NodeReport("n1"), {}, first.version, 0).version, first.version);
  const JobId id = Submit(alice_, kOneGpu);
  const api::SyncResponse woken = poll.get();
  ASSERT_NE(Find(woken, id), nullptr);
  EXPECT_NE(woken.version, first.version);
  EXPECT_EQ(Job(id).state, JobState::kScheduled);
}

TEST_F(ServerTest, StopAnswersParkedPolls) {
  const api::SyncResponse first = Sync(NodeReport("n1"));
  auto poll = std::async(std::launch::async, [&] {
    api::SyncRequest request;
    request.node = NodeReport("n1");
    request.known_version = first.version;
    request.wait_ms = 60000;
    net::HttpCallOptions call;
    call.body = json(request).dump();
    call.timeout = 30s;
    call.headers.emplace_back("Authorization", "Bearer " + agent_);
    return net::HttpCall("POST", server_->url() + "/api/v1/agents/sync", call);
  });
  ASSERT_TRUE(WaitUntil([&] {
    return Call("GET", "/metrics", "").body.find("gpufleet_agent_syncs_parked 1") !=
           std::string::npos;
  }));
  server_->Stop();
  const net::HttpResult result = poll.get();
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->status, 200) << result.response->body;
  EXPECT_EQ(json::parse(result.response->body).at("version"), first.version);
}

class LostNodeTest : public ServerTest {
 protected:
  LostNodeTest() {
    options_.node_timeout_ms = 300;
    options_.heartbeat_ms = 100;
  }
};

TEST_F(LostNodeTest, SilentNodeIsLostAndItsJobRunsElsewhere) {
  std::atomic<bool> stop{false};
  std::atomic<bool> n1_silent{false}, n2_silent{false};
  // Both agents sync every few ms until told to fall silent.
  std::thread agents([&] {
    while (!stop) {
      if (!n1_silent) Sync(NodeReport("n1"));
      if (!n2_silent) Sync(NodeReport("n2"));
      std::this_thread::sleep_for(20ms);
    }
  });
  ASSERT_TRUE(WaitUntil(
      [&] { return Call("GET", "/api/v1/nodes", admin_).Json().at("nodes").size() == 2; }));
  const JobId id = Submit(alice_, {{"command", {"x"}}, {"gpus", 4}});
  ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
  const std::string first_node = Job(id).tasks.at(0).node;
  (first_node == "n1" ? n1_silent : n2_silent) = true;

  const bool moved = WaitUntil([&] {
    const JobRecord job = Job(id);
    return job.attempt == 1 && job.state == JobState::kScheduled;
  });
  stop = true;
  agents.join();
  ASSERT_TRUE(moved);
  const JobRecord job = Job(id);
  EXPECT_NE(job.tasks.at(0).node, first_node);
  EXPECT_EQ(job.tasks.at(0).workload_id, fmt::format("j{}-r0-a1", id));
  bool saw_lost = false;
  for (const api::JobEvent& event : job.events)
    saw_lost = saw_lost || (event.to == "pending" &&
                            event.reason.find("node " + first_node + " lost") != std::string::npos);
  EXPECT_TRUE(saw_lost) << json(job).dump();
  const json nodes = Call("GET", "/api/v1/nodes", admin_).Json().at("nodes");
  for (const json& node : nodes)
    EXPECT_EQ(node.at("state"), node.at("report").at("name") == first_node ? "lost" : "ready");

  // A lost node that syncs again is ready again.
  Sync(NodeReport(first_node));
  const json back = Call("GET", "/api/v1/nodes", admin_).Json().at("nodes");
  for (const json& node : back)
    EXPECT_EQ(node.at("state"), "ready");
}

// ---- Store failure ---------------------------------------------------------------------------

// SQLite underneath, but commits fail while `fail` is set (a full or broken disk), and wait while
// `hold` is set (a store that is slow or cut off).
class FlakyStore : public store::Store {
 public:
  FlakyStore(std::unique_ptr<store::Store> inner, std::shared_ptr<std::atomic<bool>> fail,
             std::shared_ptr<std::atomic<bool>> hold)
      : inner_(std::move(inner)), fail_(std::move(fail)), hold_(std::move(hold)) {}
  std::string_view backend() const override { return inner_->backend(); }
  std::string location() const override { return inner_->location(); }
  void Commit(std::span<const store::Mutation> batch) override {
    while (*hold_)
      std::this_thread::sleep_for(1ms);
    if (*fail_) throw store::StoreError("disk full (test)");
    inner_->Commit(batch);
  }
  std::optional<std::string> Get(std::string_view key) const override { return inner_->Get(key); }
  std::vector<std::pair<std::string, std::string>> List(std::string_view prefix) const override {
    return inner_->List(prefix);
  }
  void Scan(std::string_view prefix,
            const std::function<void(std::string_view, std::string_view)>& visit) const override {
    inner_->Scan(prefix, visit);
  }

 private:
  std::unique_ptr<store::Store> inner_;
  std::shared_ptr<std::atomic<bool>> fail_;
  std::shared_ptr<std::atomic<bool>> hold_;
};

class StoreFailureTest : public ServerTest {
 protected:
  StoreFailureTest() {
    options_.open_store = [fail = fail_, hold = hold_](const std::string& data_dir) {
      return std::make_unique<FlakyStore>(store::OpenSqliteStore(data_dir), fail, hold);
    };
  }
  std::shared_ptr<std::atomic<bool>> fail_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<bool>> hold_ = std::make_shared<std::atomic<bool>>(false);
};

// An agent hears of a placement only once it is durable. Were it told earlier and the commit then
// lost (a leader cut off from etcd, whose late commit is fenced off), a new leader would place
// the job again at the same attempt: the job would run twice (seen in tests/e2e's netns faults).
TEST_F(StoreFailureTest, AnAgentIsNotToldOfAPlacementBeforeItIsDurable) {
  Sync(NodeReport("n1"));
  const JobId durable = Submit(alice_, kOneGpu);
  ASSERT_TRUE(WaitForState(durable, JobState::kScheduled));
  Sync(NodeReport("n1"));  // the agent has seen the durable placement

  *hold_ = true;
  auto submitted = std::async(std::launch::async,
                              [&] { return Call("POST", "/api/v1/jobs", alice_, kOneGpu.dump()); });
  const JobId held = durable + 1;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (Call("GET", fmt::format("/api/v1/jobs/{}", held), alice_).status != 200 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(WaitForState(held, JobState::kScheduled));  // placed in memory, not yet stored
  api::SyncRequest request;
  request.node = NodeReport("n1");
  request.agent_key = agent_key_;
  auto synced = std::async(std::launch::async, [&] {
    return Call("POST", "/api/v1/agents/sync", agent_, json(request).dump());
  });
  EXPECT_EQ(synced.wait_for(300ms), std::future_status::timeout)
      << "the sync was answered while the placement's commit was still open";
  *fail_ = true;  // that commit then fails, as a fenced one does
  *hold_ = false;
  const Reply reply = synced.get();
  EXPECT_EQ(reply.status, 503) << reply.body;
  EXPECT_EQ(reply.body.find(fmt::format("j{}-r0-a0", held)), std::string::npos) << reply.body;
  EXPECT_EQ(submitted.get().status, 503);
}

TEST_F(StoreFailureTest, FailedCommitIsAnswered503AndStopsAllChanges) {
  Sync(NodeReport("n1"));
  const JobId durable = Submit(alice_, kOneGpu);
  ASSERT_TRUE(WaitForState(durable, JobState::kScheduled));
  // Commits are applied in order: once a later change is acknowledged, the placement is durable.
  Token("carol", "vision", "user");
  EXPECT_FALSE(server_->fatal_error());

  *fail_ = true;
  Reply reply = Call("POST", "/api/v1/jobs", alice_, kOneGpu.dump());
  EXPECT_EQ(reply.status, 503);
  EXPECT_NE(reply.body.find("disk full (test)"), std::string::npos) << reply.body;
  ASSERT_TRUE(server_->WaitForFatal(0ms));
  EXPECT_NE(server_->fatal_error()->find("disk full (test)"), std::string::npos);
  EXPECT_EQ(Call("GET", "/readyz", "").status, 503);
  EXPECT_NE(Call("GET", "/metrics", "").body.find("gpufleet_up 0"), std::string::npos);
  // Nothing more is acknowledged, even once the disk is back: memory may be ahead of it.
  *fail_ = false;
  EXPECT_EQ(Call("POST", "/api/v1/jobs", alice_, kOneGpu.dump()).status, 503);
  EXPECT_EQ(Call("POST", fmt::format("/api/v1/jobs/{}/cancel", durable), alice_).status, 503);
  EXPECT_EQ(Call("POST", "/api/v1/agents/sync", agent_, json(api::SyncRequest{}).dump()).status,
            503);
  // Reads too: memory may hold what the store lost.
  const Reply read = Call("GET", fmt::format("/api/v1/jobs/{}", durable), alice_);
  EXPECT_EQ(read.status, 503);
  EXPECT_NE(read.body.find("disk full (test)"), std::string::npos) << read.body;

  // A restart reloads what is durable: the job acknowledged before, not the one refused.
  Restart();
  EXPECT_FALSE(server_->fatal_error());
  EXPECT_EQ(Job(durable).state, JobState::kScheduled);
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}", durable + 1), admin_).status, 404);
  EXPECT_EQ(Submit(alice_, kOneGpu), durable + 1);
}

// ---- Logs ---------------------------------------------------------------------------------------

TEST_F(ServerTest, LogsAreFetchedFromTheTasksAgent) {
  std::mutex mu;
  std::string seen_target;
  std::string seen_authorization;
  agent_key_ = "gpa_" + std::string(64, '7');
  net::Router fake;
  fake.Add("GET", "/v1/workloads/{id}/logs", [&](const net::HttpRequest& request) {
    {
      std::lock_guard lock(mu);
      seen_target = request.target;
      seen_authorization = request.Header("Authorization");
    }
    net::HttpResponse response = net::HttpResponse::Text(200, "epoch 1\nepoch 2\n");
    response.headers.emplace_back("X-Log-Next-Offset", "21");
    response.headers.emplace_back("X-Log-Finished", "false");
    response.headers.emplace_back("X-Other", "not passed");
    return response;
  });
  auto agent = net::HttpServer::Start(
      {}, [&fake](const net::HttpRequest& request) { return fake.Handle(request); });
  ASSERT_TRUE(agent.server) << agent.error;

  const JobId pending = Submit(alice_, kOneGpu);
  Reply reply = Call("GET", fmt::format("/api/v1/jobs/{}/logs", pending), alice_);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "");
  EXPECT_EQ(reply.raw.Header("X-Log-Finished"), "false");

  Sync(NodeReport("n1", 4, "http://" + agent.server->address()));
  ASSERT_TRUE(WaitForState(pending, JobState::kScheduled));
  reply = Call("GET", fmt::format("/api/v1/jobs/{}/logs?stream=stderr&offset=5", pending), alice_);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.body, "epoch 1\nepoch 2\n");
  EXPECT_EQ(reply.raw.Header("X-Log-Next-Offset"), "21");
  EXPECT_EQ(reply.raw.Header("X-Log-Finished"), "false");
  EXPECT_EQ(reply.raw.Header("X-Other"), "");
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen_target,
              fmt::format("/v1/workloads/j{}-r0-a0/logs?stream=stderr&offset=5", pending));
    // The key the agent gave in its sync goes with the call; nobody reads it back.
    EXPECT_EQ(seen_authorization, "Bearer " + agent_key_);
  }
  EXPECT_EQ(Call("GET", "/api/v1/nodes", admin_).body.find(agent_key_), std::string::npos);
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}/logs?task=1", pending), alice_).status, 400);
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}/logs?stream=both", pending), alice_).status,
            400);
  EXPECT_EQ(Call("GET", fmt::format("/api/v1/jobs/{}/logs?offset=-1", pending), alice_).status,
            400);

  // An agent that is gone: a prompt 502 that names the node.
  agent.server->Stop();
  reply = Call("GET", fmt::format("/api/v1/jobs/{}/logs", pending), alice_);
  EXPECT_EQ(reply.status, 502);
  EXPECT_NE(reply.body.find("node n1"), std::string::npos) << reply.body;
}

// ---- Durability, audit, metrics
// ------------------------------------------------------------------

TEST_F(ServerTest, RestartReloadsJobsNodesTokensAndTheAuditLog) {
  Sync(NodeReport("n1"));
  const JobId placed = Submit(alice_, kOneGpu);
  ASSERT_TRUE(WaitForState(placed, JobState::kScheduled));
  const JobId cancelled = Submit(bob_, {{"command", {"x"}}, {"gpus", 4}});
  ASSERT_EQ(Call("POST", fmt::format("/api/v1/jobs/{}/cancel", cancelled), bob_).status, 200);
  ASSERT_EQ(Call("POST", "/api/v1/nodes/n1/drain", admin_).status, 200);
  const JobRecord before = Job(placed);

  Restart();
  EXPECT_EQ(Call("GET", "/readyz", "").status, 200);
  const JobRecord after = Job(placed, alice_);  // alice's token came back too
  EXPECT_EQ(after.state, JobState::kScheduled);
  EXPECT_EQ(after.tasks.at(0).workload_id, before.tasks.at(0).workload_id);
  EXPECT_EQ(after.events.size(), before.events.size());
  EXPECT_EQ(Job(cancelled, bob_).state, JobState::kCancelled);
  const json nodes = Call("GET", "/api/v1/nodes", admin_).Json().at("nodes");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].at("drained"), true);
  EXPECT_EQ(nodes[0].at("gpu_jobs").size(), 1u);
  EXPECT_EQ(Call("GET", "/api/v1/tokens", admin_).Json().at("tokens").size(), 4u);
  // The agent's desired state survives too, and new ids continue after the old ones.
  ASSERT_NE(Find(Sync(NodeReport("n1")), placed), nullptr);
  EXPECT_EQ(Submit(alice_, kOneGpu), cancelled + 1);

  const std::vector<std::string> actions = AuditActions();
  const std::vector<std::string> expected = {
      fmt::format("job.submit job/{}", cancelled + 1), "node.drain node/n1",
      fmt::format("job.cancel job/{}", cancelled), fmt::format("job.submit job/{}", cancelled),
      fmt::format("job.submit job/{}", placed)};
  ASSERT_GE(actions.size(), expected.size() + 4);  // and the four token.create entries
  EXPECT_EQ(std::vector<std::string>(actions.begin(), actions.begin() + 5), expected);
  EXPECT_EQ(actions.back().substr(0, 12), "token.create");
  EXPECT_EQ(Call("GET", "/api/v1/audit?limit=2", admin_).Json().at("entries").size(), 2u);
}

TEST_F(ServerTest, FirstAdminTokenFileIsPrivate) {
  EXPECT_TRUE(server_->HasAdminToken());
  const std::string path = dir_.path() + "/admin-token";
  ASSERT_EQ(WritePrivateFile(path, admin_ + "\n"), "");
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600);
}

class FairShareTest : public ServerTest {
 protected:
  void SetUp() override {
    options_.scheduler.order = sched::QueueOrder::kFairShare;
    options_.scheduler.backfill = sched::Backfill::kEasy;
    Start();
  }

  // Runs a job on the node until it exits 0, holding its GPUs for at least `held`.
  void RunToSuccess(const api::NodeReport& node, JobId id, std::chrono::milliseconds held) {
    ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
    const api::SyncResponse desired = Sync(node);
    const api::TaskLaunch* launch = Find(desired, id);
    ASSERT_TRUE(launch);
    Sync(node, {Report(*launch, "running")}, desired.version);
    std::this_thread::sleep_for(held);
    Sync(node, {Report(*launch, "exited", 0)}, desired.version);
    ASSERT_EQ(Job(id).state, JobState::kSucceeded);
  }

  json Queue(const std::string& name) {
    const Reply reply = Call("GET", "/api/v1/queues", alice_);
    EXPECT_EQ(reply.status, 200) << reply.body;
    const json queues = reply.Json().at("queues");
    for (const json& queue : queues)
      if (queue.at("name") == name) return queue;
    ADD_FAILURE() << "no queue " << name << " in " << reply.body;
    return json::object();
  }
};

// Queue a has run a job; b has not. With both waiting, b's later job goes first, and the usage
// that decides it survives a restart (it is rebuilt from the jobs' history).
TEST_F(FairShareTest, QueueThatUsedLessGoesFirst) {
  const api::NodeReport node = NodeReport("n1");
  Sync(node);
  json whole_node = {{"command", {"true"}}, {"gpus", 4}, {"queue", "a"}};
  RunToSuccess(node, Submit(alice_, whole_node), 50ms);
  whole_node["queue"] = "hold";
  const JobId hold = Submit(alice_, whole_node);
  ASSERT_TRUE(WaitForState(hold, JobState::kScheduled));
  whole_node["queue"] = "a";
  const JobId from_a = Submit(alice_, whole_node);
  whole_node["queue"] = "b";
  const JobId from_b = Submit(bob_, whole_node);
  EXPECT_EQ(Job(from_a).state, JobState::kPending);

  const json a = Queue("a"), b = Queue("b");
  EXPECT_GT(a.at("fair_share_usage_gpu_hours").get<double>(), 0);
  EXPECT_LT(a.at("fair_share_factor").get<double>(), 1.0);
  EXPECT_EQ(b.at("fair_share_usage_gpu_hours").get<double>(), 0);
  EXPECT_EQ(b.at("fair_share_factor").get<double>(), 1.0);

  Restart();
  const json a_again = Queue("a");
  // Decayed a little further, by a 7-day half-life: the same to 6 digits.
  EXPECT_NEAR(a_again.at("fair_share_usage_gpu_hours").get<double>(),
              a.at("fair_share_usage_gpu_hours").get<double>(), 1e-6);

  RunToSuccess(node, hold, 1ms);
  ASSERT_TRUE(WaitForState(from_b, JobState::kScheduled));
  EXPECT_EQ(Job(from_a).state, JobState::kPending);
}

class IdleGpuTest : public ServerTest {
 protected:
  void SetUp() override {
    options_.idle_gpu_timeout_ms = 300;
    sched::QueueConfig reclaims, keeps;
    reclaims.name = "reclaims";
    reclaims.guaranteed_milli = 4 * kMilliPerGpu;
    reclaims.reclaim_idle = true;
    keeps.name = "keeps";
    keeps.guaranteed_milli = 4 * kMilliPerGpu;
    options_.scheduler.queues = {reclaims, keeps};
    options_.scheduler.backfill = sched::Backfill::kFirstFit;
    Start();
  }

  // Starts the job on `node` (whose GPUs show `utilization_pct`) and returns its launch.
  api::TaskLaunch Run(api::NodeReport& node, JobId id, double utilization_pct) {
    EXPECT_TRUE(WaitForState(id, JobState::kScheduled));
    for (api::GpuStatus& gpu : node.gpus)
      gpu.utilization_pct = utilization_pct;
    const api::SyncResponse desired = Sync(node);
    const api::TaskLaunch* launch = Find(desired, id);
    EXPECT_TRUE(launch);
    if (!launch) return {};
    Sync(node, {Report(*launch, "running")}, desired.version);
    return *launch;
  }

  // Syncs `node` (as agents do every heartbeat) until `done` holds.
  bool SyncUntil(const api::NodeReport& node, const api::TaskLaunch& launch,
                 const std::function<bool()>& done) {
    return WaitUntil([&] {
      Sync(node, {Report(launch, "running")});
      return done();
    });
  }
};

// A job whose GPUs stay unused is flagged; in a queue that reclaims idle GPUs it is requeued
// once another job waits for them, and that job runs. Busy GPUs clear the flag.
TEST_F(IdleGpuTest, IdleJobIsFlaggedThenReclaimedForWaitingWork) {
  api::NodeReport node = NodeReport("n1");
  Sync(node);
  const JobId idle =
      Submit(alice_, {{"command", {"sleep", "1h"}}, {"gpus", 4}, {"queue", "reclaims"}});
  const api::TaskLaunch launch = Run(node, idle, 0);
  ASSERT_TRUE(SyncUntil(node, launch, [&] { return Job(idle).idle_since_ms.has_value(); }));
  JobRecord flagged = Job(idle);
  EXPECT_EQ(flagged.state, JobState::kRunning);  // nothing waits: it keeps its GPUs
  EXPECT_NE(flagged.events.back().reason.find("idle: its GPUs have been at most 1 % utilized"),
            std::string::npos)
      << flagged.events.back().reason;
  EXPECT_NE(Call("GET", "/metrics", "").body.find("gpufleet_idle_jobs{queue=\"reclaims\"} 1"),
            std::string::npos);

  const JobId waiting = Submit(bob_, {{"command", {"true"}}, {"gpus", 1}, {"queue", "keeps"}});
  ASSERT_TRUE(SyncUntil(node, launch, [&] { return Job(idle).state == JobState::kPending; }));
  const JobRecord requeued = Job(idle);
  EXPECT_EQ(requeued.attempt, 1);
  EXPECT_FALSE(requeued.idle_since_ms);
  EXPECT_NE(requeued.events.back().reason.find("queue 'reclaims' reclaims idle GPUs"),
            std::string::npos)
      << requeued.events.back().reason;
  EXPECT_TRUE(WaitForState(waiting, JobState::kScheduled));
  EXPECT_NE(Call("GET", "/metrics", "").body.find("gpufleet_idle_reclaims_total 1"),
            std::string::npos);
}

TEST_F(IdleGpuTest, OtherQueuesOnlyFlagAndBusyGpusClearTheFlag) {
  api::NodeReport node = NodeReport("n1");
  Sync(node);
  const JobId kept =
      Submit(alice_, {{"command", {"sleep", "1h"}}, {"gpus", 4}, {"queue", "keeps"}});
  const api::TaskLaunch launch = Run(node, kept, 0.5);
  ASSERT_TRUE(SyncUntil(node, launch, [&] { return Job(kept).idle_since_ms.has_value(); }));
  Submit(bob_, {{"command", {"true"}}, {"gpus", 1}, {"queue", "reclaims"}});
  // Well past the timeout with a job waiting: flagged, never preempted.
  std::this_thread::sleep_for(1500ms);
  Sync(node, {Report(launch, "running")});
  EXPECT_EQ(Job(kept).state, JobState::kRunning);

  for (api::GpuStatus& gpu : node.gpus)
    gpu.utilization_pct = 87;
  ASSERT_TRUE(SyncUntil(node, launch, [&] { return !Job(kept).idle_since_ms.has_value(); }));
  EXPECT_EQ(Job(kept).events.back().reason, "busy again: its GPUs are in use");
}

class FgdServerTest : public ServerTest {
 protected:
  void SetUp() override {
    options_.scheduler.placement = sched::PlacementPolicy::kFgd;
    Start();
  }
};

// A 2-GPU job holds half of n1; n2 (4 GPUs) is empty. For a 1-GPU job best fit takes n1, the
// fullest node, which leaves it one GPU that no 2-GPU job can use; FGD, measuring against the
// shapes of the server's own jobs (2 GPUs and 1 GPU), takes n2, and both nodes still hold a
// 2-GPU job. (With --placement binpack this test places on n1.)
TEST_F(FgdServerTest, PlacesAgainstTheShapesOfTheServersJobs) {
  Sync(NodeReport("n1"));
  const JobId two = Submit(alice_, {{"command", {"true"}}, {"gpus", 2}});
  ASSERT_TRUE(WaitForState(two, JobState::kScheduled));
  ASSERT_EQ(Job(two).tasks[0].node, "n1");
  Sync(NodeReport("n2"));
  const JobId one = Submit(alice_, {{"command", {"true"}}, {"gpus", 1}});
  ASSERT_TRUE(WaitForState(one, JobState::kScheduled));
  EXPECT_EQ(Job(one).tasks[0].node, "n2");
}

TEST_F(ServerTest, MetricsDescribeJobsNodesAndRequests) {
  Sync(NodeReport("n1"));
  const JobId id = Submit(alice_, kOneGpu);
  ASSERT_TRUE(WaitForState(id, JobState::kScheduled));
  const Reply reply = Call("GET", "/metrics", "");
  EXPECT_EQ(reply.status, 200);
  for (const char* line :
       {"gpufleet_jobs{queue=\"default\",state=\"scheduled\"} 1",
        "gpufleet_nodes{state=\"ready\"} 1", "gpufleet_gpus_total 4", "gpufleet_gpus_allocated 1",
        "gpufleet_scheduler_cycle_seconds_bucket{le=\"0.0001\"}",
        "gpufleet_scheduler_cycle_seconds_bucket{le=\"10\"}",
        "gpufleet_api_requests_total{method=\"POST\",code=\"201\"}",
        "gpufleet_api_request_seconds_count", "gpufleet_store_commit_groups_total",
        "gpufleet_store_commit_batches_total"})
    EXPECT_NE(reply.body.find(line), std::string::npos) << line << "\n" << reply.body;
}

}  // namespace
}  // namespace gpufleet::server
