// Deployments through the API (docs/serving.md): replicas as jobs, readiness, endpoints for the
// gateways, scale from zero on a gateway's report, drains that wait for in-flight requests,
// rolling updates and restarts. The agent and the gateways are played by the test.

#include "server_test_fixture.h"

namespace gpufleet::server {
namespace {

using namespace test_support;
using namespace std::chrono_literals;
using api::JobRecord;
using api::JobState;
using nlohmann::json;

json Model(int min_replicas, int max_replicas) {
  return {{"name", "tiny"},
          {"command", {"python3", "serve.py"}},
          {"gpus", 1},
          {"min_replicas", min_replicas},
          {"max_replicas", max_replicas},
          {"models", {"tiny-chat"}},
          {"autoscaling", {{"target", 2}, {"stable_window", "6s"}, {"panic_window", "1s"}}}};
}

class DeploymentTest : public ServerTest {
 protected:
  api::DeploymentRecord Show(const std::string& name = "tiny", const std::string& token = "") {
    const Reply reply = Call("GET", "/api/v1/deployments/" + name, token.empty() ? admin_ : token);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200 ? reply.Json().get<api::DeploymentRecord>()
                               : api::DeploymentRecord{};
  }
  api::EndpointSet Endpoints(const std::string& token, uint64_t version = 0, int wait_ms = 0) {
    const Reply reply = Call(
        "GET", fmt::format("/api/v1/endpoints?version={}&wait_ms={}", version, wait_ms), token);
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.status == 200 ? reply.Json().get<api::EndpointSet>() : api::EndpointSet{};
  }
  // The replica tasks node n1 is told to run, each reported running and `ready` as given.
  std::vector<api::TaskLaunch> RunReplicas(bool ready,
                                           const std::set<JobId>& not_ready = std::set<JobId>{}) {
    api::SyncResponse desired = Sync(NodeReport("n1", 8));
    std::vector<api::WorkloadReport> reports;
    for (const api::TaskLaunch& launch : desired.desired) {
      api::WorkloadReport report = Report(launch, "running");
      report.ready = ready && !not_ready.count(launch.job_id);
      reports.push_back(report);
    }
    Sync(NodeReport("n1", 8), reports);
    return desired.desired;
  }
  void GatewayReport(const std::string& gateway, const json& deployments) {
    const Reply reply = Call(
        "POST", "/api/v1/gateways/report", gateway_,
        json{{"gateway", gateway}, {"interval_ms", 1000}, {"deployments", deployments}}.dump());
    EXPECT_EQ(reply.status, 200) << reply.body;
  }
  std::string gateway_;
};

TEST_F(DeploymentTest, ReplicasAreJobsWithPortsAndBecomeEndpointsWhenReady) {
  gateway_ = Token("gw", "", "gateway");
  Sync(NodeReport("n1", 8));
  Reply reply = Call("POST", "/api/v1/deployments", alice_, Model(2, 4).dump());
  ASSERT_EQ(reply.status, 201) << reply.body;
  EXPECT_EQ(reply.Json().at("desired_replicas"), 2);

  // Placed like any job, above batch work, each with its own port and readiness probe.
  ASSERT_TRUE(WaitUntil([&] { return Sync(NodeReport("n1", 8)).desired.size() == 2; }));
  const std::vector<api::TaskLaunch> launches = RunReplicas(false);
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_NE(launches[0].port, launches[1].port);
  for (const api::TaskLaunch& launch : launches) {
    EXPECT_GE(launch.port, 30000);
    EXPECT_EQ(launch.readiness_path, "/health");
    EXPECT_EQ(launch.env.at("PORT"), std::to_string(launch.port));
    EXPECT_EQ(launch.env.at("HOST"), "10.0.0.1");
    EXPECT_EQ(launch.env.at("GPUFLEET_DEPLOYMENT"), "tiny");
    const JobRecord job = Job(launch.job_id);
    ASSERT_TRUE(job.replica);
    EXPECT_EQ(job.team, "vision");
    EXPECT_FALSE(job.spec.preemptible);
  }
  // Running but not ready: no endpoint yet.
  api::EndpointSet set = Endpoints(gateway_);
  ASSERT_EQ(set.deployments.size(), 1u);
  EXPECT_TRUE(set.deployments[0].endpoints.empty());
  EXPECT_EQ(set.deployments[0].models, std::vector<std::string>{"tiny-chat"});

  // A gateway's long poll is answered when the first replica becomes ready.
  auto watch = std::async(std::launch::async, [&, version = set.version] {
    return Endpoints(gateway_, version, 10000);
  });
  RunReplicas(true, {launches[1].job_id});
  const api::EndpointSet changed = watch.get();
  EXPECT_NE(changed.version, set.version);
  ASSERT_EQ(changed.deployments.at(0).endpoints.size(), 1u);
  EXPECT_EQ(changed.deployments[0].endpoints[0].id, fmt::format("j{}", launches[0].job_id));
  EXPECT_EQ(changed.deployments[0].endpoints[0].host, "10.0.0.1");
  EXPECT_EQ(changed.deployments[0].endpoints[0].port, launches[0].port);
  EXPECT_EQ(Show("tiny", alice_).ready_replicas, 1);
  const std::string metrics = Call("GET", "/metrics", "").body;
  EXPECT_NE(metrics.find("gpufleet_deployment_replicas{deployment=\"tiny\",state=\"ready\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("gpufleet_deployment_replicas{deployment=\"tiny\",state=\"starting\"} 1"),
            std::string::npos);
  EXPECT_NE(
      metrics.find("gpufleet_deployment_desired_replicas{deployment=\"tiny\",team=\"vision\"} 2"),
      std::string::npos);
}

TEST_F(DeploymentTest, ReplicasArePreemptibleOnlyWhereTheQueueSaysSo) {
  sched::QueueConfig serving;
  serving.name = "serving";
  serving.guaranteed_milli = 4000;
  serving.preemptible_replicas = true;
  sched::QueueConfig batch;
  batch.name = "default";
  options_.scheduler.queues = {serving, batch};
  Restart();
  Sync(NodeReport("n1", 8));
  json spec = Model(1, 1);
  spec["queue"] = "serving";
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, spec.dump()).status, 201);
  spec = Model(1, 1);
  spec["name"] = "pinned";
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, spec.dump()).status, 201);
  for (const char* name : {"tiny", "pinned"}) {
    const api::DeploymentRecord shown = Show(name);
    ASSERT_EQ(shown.replicas.size(), 1u) << name;
    EXPECT_EQ(Job(shown.replicas[0].job_id).spec.preemptible, std::string(name) == "tiny") << name;
  }
  spec["queue"] = "nope";
  EXPECT_EQ(Call("POST", "/api/v1/deployments", alice_, spec.dump()).status, 422);
}

TEST_F(DeploymentTest, BadDeploymentsAreRefusedAndNothingIsStored) {
  Sync(NodeReport("n1", 8));
  json bad = Model(0, 2);
  bad["name"] = "Tiny_Model";
  Reply reply = Call("POST", "/api/v1/deployments", alice_, bad.dump());
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("DNS label"), std::string::npos) << reply.body;
  bad = Model(3, 2);
  EXPECT_EQ(Call("POST", "/api/v1/deployments", alice_, bad.dump()).status, 400);
  bad = Model(0, 2);
  bad["autoscaling"]["metric"] = "gpu";
  EXPECT_EQ(Call("POST", "/api/v1/deployments", alice_, bad.dump()).status, 400);
  bad = Model(0, 2);
  bad["replicas"] = 3;
  reply = Call("POST", "/api/v1/deployments", alice_, bad.dump());
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("unknown deployment field 'replicas'"), std::string::npos);
  EXPECT_EQ(Call("POST", "/api/v1/deployments", alice_, "{\"name\": ").status, 400);
  bad = Model(0, 2);
  bad["gpus"] = 16;  // more than any node has
  reply = Call("POST", "/api/v1/deployments", alice_, bad.dump());
  EXPECT_EQ(reply.status, 422) << reply.body;
  EXPECT_EQ(Call("POST", "/api/v1/deployments", "", Model(0, 2).dump()).status, 401);
  EXPECT_EQ(Call("POST", "/api/v1/deployments", agent_, Model(0, 2).dump()).status, 403);
  EXPECT_TRUE(Call("GET", "/api/v1/deployments", alice_).Json().at("deployments").empty());
  EXPECT_EQ(JobCount(), 0u);
}

TEST_F(DeploymentTest, TeamsSeeOnlyTheirOwnDeployments) {
  gateway_ = Token("gw", "", "gateway");
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, Model(0, 2).dump()).status, 201);
  EXPECT_EQ(Call("GET", "/api/v1/deployments/tiny", bob_).status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/deployments/tiny/scale", bob_, R"({"replicas": 0})").status, 404);
  EXPECT_EQ(Call("DELETE", "/api/v1/deployments/tiny", bob_).status, 404);
  EXPECT_TRUE(Call("GET", "/api/v1/deployments", bob_).Json().at("deployments").empty());
  EXPECT_TRUE(Endpoints(bob_).deployments.empty());
  EXPECT_EQ(Endpoints(alice_).deployments.size(), 1u);
  EXPECT_EQ(Endpoints(gateway_).deployments.size(), 1u);
  // Names are global (they route by Host): another team cannot take it over.
  EXPECT_EQ(Call("POST", "/api/v1/deployments", bob_, Model(0, 2).dump()).status, 409);
  // A gateway token reads endpoints and reports load, nothing else.
  EXPECT_EQ(Call("GET", "/api/v1/deployments", gateway_).status, 403);
  EXPECT_EQ(Call("POST", "/api/v1/jobs", gateway_, R"({"command": ["x"]})").status, 403);
  EXPECT_EQ(Call("POST", "/api/v1/gateways/report", alice_, R"({"gateway": "x"})").status, 403);
}

TEST_F(DeploymentTest, ScaleFromZeroOnABufferedRequestAndBackToZeroAfterTheGrace) {
  gateway_ = Token("gw", "", "gateway");
  Sync(NodeReport("n1", 8));
  json model = Model(0, 3);
  model["autoscaling"]["scale_to_zero_grace"] = "1s";
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, model.dump()).status, 201);
  EXPECT_EQ(Show().desired_replicas, 0);
  EXPECT_EQ(JobCount(), 0u);

  // The gateway holds a request and says so: one replica at once, not at the next tick.
  GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"buffered", 1}, {"arrivals", 1}}}));
  EXPECT_EQ(Show().desired_replicas, 1);
  ASSERT_TRUE(WaitUntil([&] { return Sync(NodeReport("n1", 8)).desired.size() == 1; }));
  RunReplicas(true);
  ASSERT_TRUE(WaitUntil([&] { return Show().ready_replicas == 1; }));

  // No traffic: after the stable window (6 s) and the grace period the replica is drained and,
  // with no request in flight at the gateway, stopped.
  ASSERT_TRUE(WaitUntil(
      [&] {
        GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"in_flight", json::object()}}}));
        return Show().desired_replicas == 0;
      },
      20s));
  ASSERT_TRUE(WaitUntil([&] {
    GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"in_flight", json::object()}}}));
    return Show().replicas.empty();
  }));
  EXPECT_TRUE(Endpoints(gateway_).deployments.at(0).endpoints.empty());
}

TEST_F(DeploymentTest, ADrainingReplicaStopsOnlyOnceNoGatewayHasARequestOnIt) {
  gateway_ = Token("gw", "", "gateway");
  Sync(NodeReport("n1", 8));
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, Model(2, 2).dump()).status, 201);
  ASSERT_TRUE(WaitUntil([&] { return Sync(NodeReport("n1", 8)).desired.size() == 2; }));
  RunReplicas(true);
  ASSERT_TRUE(WaitUntil([&] { return Show().ready_replicas == 2; }));
  const api::DeploymentRecord before = Show();
  // The newest replica is the one a scale-down drains; the gateway has a request on it.
  const JobId newest = std::max(before.replicas[0].job_id, before.replicas[1].job_id);
  const std::string id = fmt::format("j{}", newest);
  GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"in_flight", {{id, 1}}}}}));
  ASSERT_EQ(Call("POST", "/api/v1/deployments/tiny/scale", alice_, R"({"replicas": 1})").status,
            200);
  const api::EndpointSet set = Endpoints(gateway_);
  ASSERT_EQ(set.deployments.at(0).endpoints.size(), 1u);
  EXPECT_NE(set.deployments[0].endpoints[0].id, id);  // no new requests go to it
  // Still in flight after the gateway saw the drain: the replica keeps running.
  std::this_thread::sleep_for(1500ms);
  GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"in_flight", {{id, 1}}}}}));
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(Job(newest).state, JobState::kRunning);
  EXPECT_EQ(Show().replicas.size(), 2u);
  // Its request finished: stopped.
  GatewayReport("gw-1", json::array({{{"name", "tiny"}, {"in_flight", {{id, 0}}}}}));
  ASSERT_TRUE(WaitForState(newest, JobState::kCancelled));
  EXPECT_NE(Job(newest).reason.find("drained"), std::string::npos);
  EXPECT_EQ(Show().replicas.size(), 1u);
}

TEST_F(DeploymentTest, ASpecChangeRollsReplicasOneByOneKeepingTheReadyCount) {
  Sync(NodeReport("n1", 8));
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, Model(2, 2).dump()).status, 201);
  ASSERT_TRUE(WaitUntil([&] { return Sync(NodeReport("n1", 8)).desired.size() == 2; }));
  RunReplicas(true);
  ASSERT_TRUE(WaitUntil([&] { return Show().ready_replicas == 2; }));
  json changed = Model(2, 2);
  changed["env"] = {{"VERSION", "2"}};
  Reply reply = Call("POST", "/api/v1/deployments", alice_, changed.dump());
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.Json().at("generation"), 2);
  // Surge 1: one new replica, the old two keep serving until it is ready.
  ASSERT_TRUE(WaitUntil([&] { return Show().replicas.size() == 3; }));
  api::DeploymentRecord rolling = Show();
  int ready = 0;
  for (const api::ReplicaStatus& replica : rolling.replicas)
    ready += replica.state == "ready" ? 1 : 0;
  EXPECT_EQ(ready, 2);
  // Each new replica that becomes ready replaces an old one, until all run generation 2.
  ASSERT_TRUE(WaitUntil(
      [&] {
        RunReplicas(true);
        const api::DeploymentRecord now = Show();
        int ready_now = 0;
        for (const api::ReplicaStatus& replica : now.replicas)
          ready_now += replica.state == "ready" ? 1 : 0;
        EXPECT_GE(ready_now, 1);  // never without a ready replica
        return now.replicas.size() == 2 &&
               std::all_of(now.replicas.begin(), now.replicas.end(),
                           [](const auto& r) { return r.generation == 2 && r.state == "ready"; });
      },
      20s));
  // Unchanged spec: nothing rolls.
  EXPECT_EQ(Call("POST", "/api/v1/deployments", alice_, changed.dump()).Json().at("generation"), 2);
}

TEST_F(DeploymentTest, AFailedReplicaIsReplacedAndTheDeploymentSurvivesARestart) {
  Sync(NodeReport("n1", 8));
  ASSERT_EQ(Call("POST", "/api/v1/deployments", alice_, Model(1, 1).dump()).status, 201);
  ASSERT_TRUE(WaitUntil([&] { return Sync(NodeReport("n1", 8)).desired.size() == 1; }));
  const std::vector<api::TaskLaunch> first = RunReplicas(true);
  ASSERT_EQ(first.size(), 1u);
  Sync(NodeReport("n1", 8), {Report(first[0], "exited", 1)});
  ASSERT_TRUE(WaitForState(first[0].job_id, JobState::kFailed));
  ASSERT_TRUE(WaitUntil([&] {
    const api::SyncResponse desired = Sync(NodeReport("n1", 8));
    return desired.desired.size() == 1 && desired.desired[0].job_id != first[0].job_id;
  }));
  EXPECT_EQ(Show().failures_in_a_row, 1);
  Restart();
  const api::DeploymentRecord after = Show();
  EXPECT_EQ(after.spec.models, std::vector<std::string>{"tiny-chat"});
  ASSERT_EQ(after.replicas.size(), 1u);
  EXPECT_NE(after.replicas[0].job_id, first[0].job_id);
  ASSERT_EQ(Call("DELETE", "/api/v1/deployments/tiny", alice_).status, 200);
  EXPECT_EQ(Job(after.replicas[0].job_id).state, JobState::kCancelled);
  EXPECT_EQ(Call("GET", "/api/v1/deployments/tiny", alice_).status, 404);
  Restart();
  EXPECT_EQ(Call("GET", "/api/v1/deployments/tiny", alice_).status, 404);
}

}  // namespace
}  // namespace gpufleet::server
