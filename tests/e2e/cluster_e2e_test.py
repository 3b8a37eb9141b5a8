"""End to end through the real binaries on loopback: a user submits, watches, reads logs of and
cancels jobs with the CLI; teams cannot touch each other's jobs; a running job outlives its
agent's restart; a lost node's job is requeued elsewhere; and a server killed with SIGKILL under
a stream of submissions loses none it acknowledged.

Usage: cluster_e2e_test.py path/to/gpufleet [test-name ...]"""

import json
import os
import re
import signal
import subprocess
import sys
import time

from e2e_testlib import (Cluster, SubmitLoad, api, check, http, kill_recorded_workloads,
                         pid_alive, prometheus_query, run_tests, wait_until)
from agent_testlib import start_prometheus


def test_cli_submit_logs_cancel(gpufleet):
    with Cluster(gpufleet, "cli") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a")

        out = cluster.cli("submit", "--gpus", "2", "--name", "hello", "--", "sh", "-c",
                          "echo hello from $CUDA_VISIBLE_DEVICES rank $RANK of $WORLD_SIZE").stdout
        check("submitted" in out, f"submit said {out!r}")
        job_id = int(out.split("job ", 1)[1].split()[0].rstrip(":"))
        job = cluster.wait_state(job_id, "succeeded")
        check(job["tasks"][0]["node"] == "node-a" and len(job["tasks"][0]["gpu_indices"]) == 2,
              f"placement: {job['tasks']}")
        states = [event["to"] for event in job["events"]]
        check(states[0] == "pending" and states[-1] == "succeeded" and "running" in states,
              f"events: {states}")
        logs = cluster.cli("logs", str(job_id)).stdout
        gpus = ",".join(str(index) for index in job["tasks"][0]["gpu_indices"])
        check(logs == f"hello from {gpus} rank 0 of 1\n", f"logs: {logs!r}")

        listed = cluster.cli("jobs").stdout
        check(re.search(rf"^\s*{job_id}\s.*succeeded", listed, re.MULTILINE),
              f"jobs: {listed!r}")
        shown = cluster.cli("job", "show", str(job_id)).stdout
        check("succeeded" in shown and "running" in shown, f"job show: {shown!r}")
        as_json = json.loads(cluster.cli("jobs", "-o", "json").stdout)
        check(any(entry["id"] == job_id for entry in
                  (as_json["jobs"] if isinstance(as_json, dict) else as_json)),
              "jobs -o json lacks the job")

        # A long job: follow its logs while it runs, then cancel it; its processes end.
        out = cluster.cli("submit", "--gpus", "1", "--", "sh", "-c",
                          "echo started pid $$; exec sleep 300").stdout
        long_id = int(out.split("job ", 1)[1].split()[0].rstrip(":"))
        cluster.wait_state(long_id, "running")
        text = wait_until(lambda: (lambda t: t if "started pid" in t else None)(
            cluster.logs(long_id)), 10, "the long job's first line")
        pid = int(text.split("started pid ", 1)[1].split()[0])
        check(pid_alive(pid), "the long job's process is not running")
        cluster.cli("cancel", str(long_id))
        job = cluster.wait_state(long_id, "cancelled")
        wait_until(lambda: not pid_alive(pid), 15, "the cancelled job's process to end")
        # A follow of a finished job prints what there is and returns.
        followed = cluster.cli("logs", "-f", str(long_id), timeout=20).stdout
        check("started pid" in followed, f"logs -f: {followed!r}")

        nodes = cluster.cli("nodes").stdout
        check("node-a" in nodes and "ready" in nodes, f"nodes: {nodes!r}")
        queues = cluster.cli("queues").stdout
        check("default" in queues, f"queues: {queues!r}")
        top = cluster.cli("top", "--once").stdout
        check("node-a" in top, f"top: {top!r}")

        # More GPUs than the cluster has: refused at once, with the reason, and nothing stored.
        refused = cluster.cli("submit", "--gpus", "8", "--nodes", "2", "--", "true", check_code=1)
        check("GPU" in refused.stderr, f"impossible job: {refused.stderr!r}")
        # Two distinct nodes on a cluster of one: refused, though its two GPUs are free.
        refused = cluster.cli("submit", "--gpus", "1", "--nodes", "2", "--", "true", check_code=1)
        check("needs 2 distinct nodes that each hold 1 of its tasks" in refused.stderr,
              f"a 2-node job on one node: {refused.stderr!r}")
        status, body = api(cluster.url, cluster.admin_token, "POST", "/api/v1/jobs",
                           '{"command": ["true"], "gpus": 1, "colour": "red"}')
        check(status == 400 and "colour" in body.get("error", ""), f"unknown field: {body}")
        status, body = api(cluster.url, cluster.admin_token, "POST", "/api/v1/jobs", "{nope")
        check(status == 400, f"malformed JSON: {status} {body}")
        listed = json.loads(cluster.cli("jobs", "-o", "json").stdout)
        listed = listed["jobs"] if isinstance(listed, dict) else listed
        check(len(listed) == 2, f"a refused job was stored: {[j['id'] for j in listed]}")


def test_teams_are_isolated(gpufleet):
    with Cluster(gpufleet, "teams") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a")
        alice = cluster.token("alice", "vision")
        bob = cluster.token("bob", "speech")
        job = cluster.submit({"command": ["sh", "-c", "echo secret; sleep 300"], "gpus": 1}, bob)
        cluster.wait_state(job["id"], "running")
        for method, path in (("GET", f"/api/v1/jobs/{job['id']}"),
                             ("POST", f"/api/v1/jobs/{job['id']}/cancel"),
                             ("GET", f"/api/v1/jobs/{job['id']}/logs?task=0&offset=0")):
            status, body = api(cluster.url, alice, method, path)
            check(status == 404, f"alice {method} {path}: HTTP {status} {body}")
        status, body = api(cluster.url, alice, "GET", "/api/v1/jobs")
        check(status == 200 and body["jobs"] == [], f"alice sees bob's jobs: {body}")
        refused = cluster.cli("cancel", str(job["id"]), token=alice, check_code=1)
        check("error" in refused.stderr, f"alice's cancel: {refused.stderr!r}")
        check(cluster.job(job["id"], bob)["state"] == "running", "bob's job was touched")
        status, _ = api(cluster.url, alice, "POST", "/api/v1/nodes/node-a/drain")
        check(status == 403, f"a user drained a node: HTTP {status}")
        status, _ = api(cluster.url, None, "GET", "/api/v1/jobs")
        check(status == 401, f"no token: HTTP {status}")
        status, _ = api(cluster.url, "gpf_" + "0" * 64, "GET", "/api/v1/jobs")
        check(status == 401, f"unknown token: HTTP {status}")
        # Bob cancels his own; the audit log (admin) names both submissions and the cancel.
        status, _ = api(cluster.url, bob, "POST", f"/api/v1/jobs/{job['id']}/cancel")
        check(status == 200, f"bob's cancel: HTTP {status}")
        status, audit = api(cluster.url, cluster.admin_token, "GET", "/api/v1/audit")
        actions = [(entry["user"], entry["action"]) for entry in audit.get("entries", audit)
                   ] if status == 200 else []
        check(("bob", "job.submit") in actions and ("bob", "job.cancel") in actions,
              f"audit: HTTP {status} {actions}")
        status, _ = api(cluster.url, bob, "GET", "/api/v1/audit")
        check(status == 403, f"a user read the audit log: HTTP {status}")

        # Usage: bob's job held a GPU; the admin sees it per team and user, alice sees none of it.
        cluster.wait_state(job["id"], "cancelled")
        status, usage = api(cluster.url, cluster.admin_token, "GET", "/api/v1/usage?by=user")
        rows = usage.get("usage", [])
        check(status == 200 and any(row["team"] == "speech" and row["user"] == "bob" and
                                    row["gpu_ms"] > 0 and row["jobs"] == 1 for row in rows),
              f"usage by user: HTTP {status} {usage}")
        status, usage = api(cluster.url, alice, "GET", "/api/v1/usage")
        check(status == 200 and usage["usage"] == [], f"alice sees usage: {usage}")
        table = cluster.cli("usage", "--since", "1h", "--by", "user").stdout
        check(re.search(r"^speech\s+bob\s+\d+\.\d\d\s+1$", table, re.MULTILINE),
              f"usage table: {table!r}")
        status, metrics = http("GET", cluster.url + "/metrics")
        check('gpufleet_team_gpu_seconds_total{team="speech"}' in metrics,
              "no per-team GPU-seconds in /metrics")
        seconds = re.search(r'^gpufleet_user_gpu_seconds_total\{team="speech",user="bob"\} (\S+)$',
                            metrics, re.MULTILINE)
        check(seconds and float(seconds.group(1)) > 0, "no GPU-seconds for bob in /metrics")


def test_agent_restart_keeps_the_job(gpufleet):
    with Cluster(gpufleet, "agent-restart") as cluster:
        cluster.start_server()
        token = cluster.token("agent-node-a", "system", "agent")
        agent = cluster.start_agent("node-a", token=token)
        marker = os.path.join(cluster.root, "release")
        job = cluster.submit({"command": ["sh", "-c", f"echo pid $$; while [ ! -e {marker} ]; "
                                          "do sleep 0.1; done; echo released"], "gpus": 1})
        cluster.wait_state(job["id"], "running")
        text = wait_until(lambda: (lambda t: t if "pid" in t else None)(cluster.logs(job["id"])),
                          10, "the job's pid")
        pid = int(text.split("pid ", 1)[1].split()[0])

        agent.stop(signal.SIGKILL)
        check(pid_alive(pid), "the workload died with its agent")
        cluster.start_agent("node-a", token=token)
        check(pid_alive(pid), "the restarted agent relaunched or killed the workload")
        check(cluster.job(job["id"])["state"] == "running", "the job left running")
        open(marker, "w").close()
        done = cluster.wait_state(job["id"], ("succeeded", "failed"))
        check(done["state"] == "succeeded" and done["attempt"] == 0,
              f"after the agent restart: {done['state']} attempt {done['attempt']}: "
              f"{done['reason']}")
        check("released" in cluster.logs(job["id"]), "the job's output after the restart")


def test_lost_node_requeues_its_job(gpufleet):
    with Cluster(gpufleet, "lost",
                 server_args=["--node-timeout", "1500ms", "--heartbeat", "500ms"]) as cluster:
        cluster.start_server()
        cluster.start_agent("node-a", "127.0.0.2")
        cluster.start_agent("node-b", "127.0.0.3")
        job = cluster.submit({"command": ["sleep", "300"], "gpus": 4})
        first = cluster.wait_state(job["id"], "running")
        lost_node = first["tasks"][0]["node"]
        other = "node-b" if lost_node == "node-a" else "node-a"
        cluster.agents[lost_node].stop(signal.SIGKILL)
        # The machine is gone: its workloads with it.
        kill_recorded_workloads(os.path.join(cluster.root, f"agent-{lost_node}"))
        again = wait_until(lambda: (lambda j: j if j["attempt"] == 1 and j["state"] == "running"
                                    else None)(cluster.job(job["id"])), 30,
                           "the job to run again elsewhere")
        check(again["tasks"][0]["node"] == other, f"requeued onto {again['tasks'][0]['node']}")
        check(any("lost" in event["reason"] for event in again["events"]),
              f"no 'lost' event: {again['events']}")
        node = next(n for n in cluster.nodes() if n["report"]["name"] == lost_node)
        check(node["state"] == "lost", f"node state {node['state']}")
        # Not restartable: failed instead. The first job makes room for it on the last node.
        status, _ = api(cluster.url, cluster.admin_token, "POST", f"/api/v1/jobs/{job['id']}/cancel")
        check(status == 200, f"cancel: HTTP {status}")
        cluster.wait_state(job["id"], "cancelled")
        job2 = cluster.submit({"command": ["sleep", "300"], "gpus": 4, "restartable": False})
        cluster.wait_state(job2["id"], "running")
        cluster.agents[other].stop(signal.SIGKILL)
        kill_recorded_workloads(os.path.join(cluster.root, f"agent-{other}"))
        failed = cluster.wait_state(job2["id"], "failed", timeout=30)
        check("lost" in failed["reason"], f"reason: {failed['reason']}")


def test_gpu_shares(gpufleet):
    """Jobs asking for half a GPU share one: both run on the node's single GPU at once, each told
    its share and memory limit; a third half waits until a share is free."""
    with Cluster(gpufleet, "shares") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a", gpus="1xA100-80GB")
        go = os.path.join(cluster.root, "go")
        command = ("echo share $GPUFLEET_GPU_SHARE of GPU $CUDA_VISIBLE_DEVICES, "
                   f"$GPUFLEET_GPU_MEMORY_LIMIT_MIB MiB; while [ ! -e {go} ]; do sleep 0.1; done")
        ids = []
        for _ in range(3):
            out = cluster.cli("submit", "--gpus", "0.5", "--", "sh", "-c", command).stdout
            ids.append(int(out.split("job ", 1)[1].split()[0].rstrip(":")))
        first, second = (cluster.wait_state(job_id, "running") for job_id in ids[:2])
        check(first["tasks"][0]["gpu_indices"] == second["tasks"][0]["gpu_indices"] == [0],
              f"the halves are on GPUs {first['tasks']} and {second['tasks']}")
        third = cluster.job(ids[2])
        check(third["state"] == "pending", f"a third half is {third['state']}")
        text = wait_until(lambda: (lambda t: t if "share" in t else None)(cluster.logs(ids[0])),
                          10, "the first half's output")
        check(text.startswith("share 0.500 of GPU 0, "), f"the first half said {text!r}")
        open(go, "w").close()
        for job_id in ids:
            check(cluster.wait_state(job_id, ("succeeded", "failed"))["state"] == "succeeded",
                  f"job {job_id} did not succeed")


def read_file(path):
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


CHECKPOINTING_JOB = r"""
echo "attempt $GPUFLEET_RESTART_COUNT in $GPUFLEET_CHECKPOINT_DIR"
if [ -f "$GPUFLEET_CHECKPOINT_DIR/step" ]; then
  echo "resumed from step $(cat "$GPUFLEET_CHECKPOINT_DIR/step")"; exit 0
fi
trap 'echo "SIGTERM: saving step 42"; echo 42 > "$GPUFLEET_CHECKPOINT_DIR/step"; exit 0' TERM
echo 41 > "$GPUFLEET_CHECKPOINT_DIR/step"
while true; do sleep 0.1; done
"""


def test_checkpoint_survives_requeue(gpufleet):
    """A job's GPUFLEET_CHECKPOINT_DIR (under --checkpoint-root, storage both nodes see) is the
    same on every attempt: the job requeued off a lost node resumes from it with
    GPUFLEET_RESTART_COUNT 1. A cancelled job gets SIGTERM and its grace period to save."""
    with Cluster(gpufleet, "checkpoint", server_args=[
            "--node-timeout", "1500ms", "--heartbeat", "500ms"]) as cluster:
        root = os.path.join(cluster.root, "checkpoints")
        cluster.server_args += ["--checkpoint-root", root]
        cluster.start_server()
        cluster.start_agent("node-a", "127.0.0.2")
        cluster.start_agent("node-b", "127.0.0.3")
        job = cluster.submit({"command": ["sh", "-c", CHECKPOINTING_JOB], "gpus": 4,
                              "grace_period": "20s"})
        first = cluster.wait_state(job["id"], "running")
        text = wait_until(lambda: (lambda t: t if "attempt" in t else None)(
            cluster.logs(job["id"])), 10, "the first attempt's output")
        job_dir = os.path.join(root, f"job-{job['id']}")
        check(text == f"attempt 0 in {job_dir}\n", f"first attempt said {text!r}")
        # The first attempt has checkpointed step 41; then its node is lost.
        wait_until(lambda: read_file(os.path.join(job_dir, "step")) == "41\n", 10, "a checkpoint")
        lost = first["tasks"][0]["node"]
        cluster.agents[lost].stop(signal.SIGKILL)
        kill_recorded_workloads(os.path.join(cluster.root, f"agent-{lost}"))
        done = cluster.wait_state(job["id"], ("succeeded", "failed"), timeout=30)
        check(done["state"] == "succeeded" and done["attempt"] == 1,
              f"after the requeue: {done['state']} attempt {done['attempt']}: {done['reason']}")
        check(done["tasks"][0]["node"] != lost, "the job came back on its lost node")
        resumed = cluster.logs(job["id"])
        check(resumed == f"attempt 1 in {job_dir}\nresumed from step 41\n",
              f"the second attempt said {resumed!r}")

        # Cancel: SIGTERM, and the job saves within its grace period instead of being killed.
        again = cluster.submit({"command": ["sh", "-c", CHECKPOINTING_JOB], "gpus": 4,
                                "grace_period": "20s"})
        cluster.wait_state(again["id"], "running")
        again_dir = os.path.join(root, f"job-{again['id']}")
        wait_until(lambda: read_file(os.path.join(again_dir, "step")) == "41\n", 10,
                   "the job to start working")
        status, _ = api(cluster.url, cluster.admin_token, "POST",
                        f"/api/v1/jobs/{again['id']}/cancel")
        check(status == 200, f"cancel: HTTP {status}")
        cluster.wait_state(again["id"], "cancelled")
        wait_until(lambda: "saving step 42" in cluster.logs(again["id"]), 15,
                   "the job's SIGTERM handler")
        check(read_file(os.path.join(again_dir, "step")) == "42\n",
              "the checkpoint written on SIGTERM")


QUEUES = """\
- {name: team-a, cohort: lab, guaranteed_gpus: 1}
- {name: team-b, cohort: lab, guaranteed_gpus: 1}
"""


def start_two_teams(cluster):
    """A server with QUEUES and one 2-GPU node; returns the tokens of alice (team-a's user) and
    bob (team-b's)."""
    queues = os.path.join(cluster.root, "queues.yaml")
    with open(queues, "w") as file:
        file.write(QUEUES)
    cluster.server_args += ["--queues", queues]
    cluster.start_server()
    cluster.start_agent("node-a", gpus="2xH100-80GB")
    return cluster.token("alice", "a"), cluster.token("bob", "b")


def test_quota_reclaim_checkpoints_and_requeues(gpufleet):
    """Team A (1 GPU guaranteed) runs two 1-GPU jobs, the second on team B's idle guarantee;
    when B submits, A's borrowing job is preempted (reclaim): it saves a checkpoint on SIGTERM,
    waits in the queue, and resumes from it once B is done. A's job within its guarantee runs on."""
    with Cluster(gpufleet, "reclaim") as cluster:
        alice, bob = start_two_teams(cluster)
        status, body = api(cluster.url, alice, "POST", "/api/v1/jobs",
                           {"command": ["true"], "queue": "nope"})
        check(status == 422 and "team-a, team-b" in body.get("error", ""),
              f"unknown queue: {status} {body}")
        listed = cluster.cli("queues").stdout
        check(re.search(r"^team-a\s.*\s1\s+-\s+lab\s+1\s+\*\s+0\.00\s+1\.000$", listed,
                        re.MULTILINE), f"queues: {listed!r}")

        kept = cluster.submit({"command": ["sleep", "300"], "gpus": 1, "queue": "team-a"},
                              alice)
        cluster.wait_state(kept["id"], "running")
        borrower = cluster.submit({"command": ["sh", "-c", CHECKPOINTING_JOB], "gpus": 1,
                                   "queue": "team-a", "grace_period": "20s"}, alice)
        cluster.wait_state(borrower["id"], "running")
        job_dir = os.path.join(cluster.root, "agent-node-a", "checkpoints",
                               f"job-{borrower['id']}")
        wait_until(lambda: read_file(os.path.join(job_dir, "step")) == "41\n", 10,
                   "the borrower's first checkpoint")

        owner = cluster.submit({"command": ["sh", "-c", "echo mine; sleep 1"], "gpus": 1,
                                "queue": "team-b"}, bob)
        check(cluster.wait_state(owner["id"], ("succeeded", "failed"), timeout=40)["state"] ==
              "succeeded", "team B's job within its guarantee")
        done = cluster.wait_state(borrower["id"], ("succeeded", "failed"), timeout=40)
        check(done["state"] == "succeeded" and done["attempt"] == 1,
              f"the borrower: {done['state']} attempt {done['attempt']}: {done['reason']}")
        check(any("borrowing" in event["reason"] for event in done["events"]),
              f"no reclaim event: {[event['reason'] for event in done['events']]}")
        resumed = cluster.logs(borrower["id"], token=alice)
        check(resumed == f"attempt 1 in {job_dir}\nresumed from step 42\n",
              f"the borrower's second attempt said {resumed!r}")
        within = cluster.job(kept["id"], alice)
        check(within["state"] == "running" and within["attempt"] == 0,
              f"A's job within its guarantee: {within['state']} attempt {within['attempt']}")


IDLE_QUEUES = """\
- {name: team-a, guaranteed_gpus: 2, reclaim_idle: true}
- {name: team-b, guaranteed_gpus: 2}
"""


def test_idle_gpus_are_reclaimed_with_a_checkpoint(gpufleet):
    """A job whose (simulated) GPUs stay at 0 % is flagged idle; its queue reclaims idle GPUs,
    so when another team's job waits it gets SIGTERM, saves a checkpoint and is requeued behind
    that job, which runs; then it resumes from its checkpoint."""
    with Cluster(gpufleet, "idle") as cluster:
        queues = os.path.join(cluster.root, "queues.yaml")
        with open(queues, "w") as file:
            file.write(IDLE_QUEUES)
        cluster.server_args += ["--queues", queues, "--idle-gpu-timeout", "2s",
                                "--heartbeat", "1s"]
        cluster.start_server()
        cluster.start_agent("node-a", gpus="2xH100-80GB")
        alice = cluster.token("alice", "a")
        bob = cluster.token("bob", "b")
        idle = cluster.submit({"command": ["sh", "-c", CHECKPOINTING_JOB], "gpus": 2,
                               "queue": "team-a", "grace_period": "20s",
                               "env": {"GPUFLEET_SIM_GPU_UTILIZATION": "0"}}, alice)
        cluster.wait_state(idle["id"], "running")
        wait_until(lambda: cluster.job(idle["id"], alice).get("idle_since_ms") is not None, 20,
                   "the idle flag")
        check(cluster.job(idle["id"], alice)["state"] == "running",
              "an idle job keeps its GPUs while nothing waits")
        other = cluster.submit({"command": ["sh", "-c", "echo mine"], "gpus": 1,
                                "queue": "team-b"}, bob)
        check(cluster.wait_state(other["id"], ("succeeded", "failed"), timeout=40)["state"] ==
              "succeeded", "the waiting job")
        done = cluster.wait_state(idle["id"], ("succeeded", "failed"), timeout=40)
        reasons = [event["reason"] for event in done["events"]]
        check(done["state"] == "succeeded" and done["attempt"] == 1,
              f"the idle job: {done['state']} attempt {done['attempt']}: {reasons}")
        check(any("reclaims idle GPUs" in reason for reason in reasons),
              f"no idle reclaim event: {reasons}")
        resumed = cluster.logs(idle["id"], token=alice)
        check(resumed.endswith("resumed from step 42\n"),
              f"the idle job's second attempt said {resumed!r}")
        metrics = http("GET", cluster.url + "/metrics", timeout=5)[1]
        check("gpufleet_idle_reclaims_total 1" in metrics, "the reclaim counter")


def test_server_kill9_loses_no_acknowledged_job(gpufleet):
    with Cluster(gpufleet, "kill9") as cluster:
        cluster.start_server()
        load = SubmitLoad(cluster.url, cluster.admin_token, 8)
        wait_until(lambda: load.count() >= 300, 30, "300 acknowledged submissions")
        cluster.kill_server()
        load.stop()
        acknowledged = load.acknowledged
        cluster.start_server()
        for job_id, name in acknowledged:
            job = cluster.job(job_id)
            check(job["spec"]["name"] == name, f"job {job_id} came back as {job['spec']['name']}")
        print(f"  {len(acknowledged)} acknowledged submissions all survived SIGKILL")


def test_tls(gpufleet):
    """HTTPS end to end: the agent syncs and the CLI talks over TLS, trusting only the CA given;
    a client without it is refused by certificate verification, not served in the clear."""
    with Cluster(gpufleet, "tls", tls=True) as cluster:
        cluster.start_server()
        check(cluster.url.startswith("https://"), f"server URL {cluster.url}")
        cluster.start_agent("node-a")
        out = cluster.cli("submit", "--gpus", "1", "--", "echo", "over tls").stdout
        job_id = int(out.split("job ", 1)[1].split()[0].rstrip(":"))
        cluster.wait_state(job_id, "succeeded")
        # The logs come from the agent's HTTPS API, which the server verifies with --agent-ca-file.
        check(cluster.agents["node-a"].url.startswith("https://"), "the agent serves HTTPS")
        check(cluster.cli("logs", str(job_id)).stdout == "over tls\n", "logs over TLS")
        env = dict(os.environ, GPUFLEET_SERVER=cluster.url, GPUFLEET_TOKEN=cluster.admin_token)
        env.pop("GPUFLEET_CA_FILE", None)
        untrusting = subprocess.run([gpufleet, "jobs"], env=env, capture_output=True, text=True,
                                    timeout=30, cwd=cluster.root)
        check(untrusting.returncode != 0 and "certificate" in untrusting.stderr,
              f"a client without the CA: exit {untrusting.returncode}: {untrusting.stderr!r}")
        plain = cluster.url.replace("https://", "http://")
        try:
            status, _ = http("GET", plain + "/healthz", timeout=5)
        except OSError:
            status = 0
        check(status != 200, "the TLS port answered plain HTTP")


def test_team_metrics_in_prometheus(gpufleet):
    """A real Prometheus (Debian's) scrapes the server while team B reclaims its guarantee from
    team A: the queue, preemption and usage series read back with the right values, and every
    query of deploy/grafana/gpufleet-teams.json is valid PromQL that returns data (those over a
    rate once two scrapes are in)."""
    prometheus = "/usr/bin/prometheus"
    check(os.access(prometheus, os.X_OK),
          f"{prometheus} is missing (Debian package 'prometheus'; `make deps` installs it)")
    with Cluster(gpufleet, "prometheus") as cluster:
        alice, bob = start_two_teams(cluster)
        borrower = cluster.submit({"command": ["sleep", "300"], "gpus": 2, "queue": "team-a",
                                   "grace_period": "1s"}, alice)
        cluster.wait_state(borrower["id"], "running")
        owner = cluster.submit({"command": ["sleep", "300"], "gpus": 1, "queue": "team-b"}, bob)
        cluster.wait_state(owner["id"], "running", timeout=40)

        server, url, log = start_prometheus(prometheus, cluster.root, "gpufleet-server",
                                            cluster.url.removeprefix("http://"))
        try:
            reclaims = wait_until(lambda: (lambda result: result if result else None)(
                prometheus_query(url, 'gpufleet_preemptions_total{reason="reclaim"}')), 30,
                "gpufleet_preemptions_total{reason=\"reclaim\"} in Prometheus")
            check(reclaims[0]["value"][1] == "1", f"reclaims: {reclaims}")
            values = {(entry["metric"]["queue"], entry["metric"]["state"]): entry["value"][1]
                      for entry in prometheus_query(url, "gpufleet_queue_gpus")}
            check(values == {("team-a", "running"): "0", ("team-a", "pending"): "2",
                             ("team-b", "running"): "1", ("team-b", "pending"): "0"},
                  f"gpufleet_queue_gpus: {values}")
            guaranteed = prometheus_query(url, 'gpufleet_queue_guaranteed_gpus{cohort="lab"}')
            check(sorted(entry["value"][1] for entry in guaranteed) == ["1", "1"],
                  f"guarantees: {guaranteed}")
            alice_seconds = prometheus_query(
                url, 'gpufleet_user_gpu_seconds_total{team="a",user="alice"}')
            check(alice_seconds and float(alice_seconds[0]["value"][1]) > 0,
                  f"alice's GPU-seconds: {alice_seconds}")
            # Two scrapes at least, so that rates have data too.
            wait_until(lambda: prometheus_query(url, "count_over_time(gpufleet_up[1m]) >= 3"),
                       20, "three scrapes of the server")
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "deploy", "grafana", "gpufleet-teams.json")
            with open(path) as file:
                dashboard = json.load(file)
            queried = 0
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expression = (target["expr"].replace("$queue", ".*").replace("$team", ".*")
                                  .replace("$__range", "1m"))
                    check(prometheus_query(url, expression),
                          f"dashboard panel '{panel['title']}': no data for {expression}")
                    queried += 1
            check(queried >= 15, f"only {queried} dashboard queries")
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()


TESTS = [test_cli_submit_logs_cancel, test_teams_are_isolated, test_agent_restart_keeps_the_job,
         test_lost_node_requeues_its_job, test_checkpoint_survives_requeue, test_gpu_shares,
         test_quota_reclaim_checkpoints_and_requeues, test_idle_gpus_are_reclaimed_with_a_checkpoint,
         test_server_kill9_loses_no_acknowledged_job, test_tls, test_team_metrics_in_prometheus]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
