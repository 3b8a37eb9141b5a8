"""Inference serving end to end through the real binary: `gpufleet dev` (server, agent and gateway
in one process) runs deployments of the reference model server (examples/model-server, Debian's
python3-torch); requests go through the gateway's OpenAI API with a platform token.

- a deployment with min 0: the first request is buffered and answered after the cold start; bad
  model names get 404, bad JSON 400, no token 401, another team's deployment 404;
- load spreads over 3 replicas; a replica killed mid-stream fails only its own streams and the
  next requests go elsewhere;
- scale down drains and a rolling update replaces every replica under constant load, and not
  one request fails;
- a real Prometheus scraping a server and a gateway answers every query of
  deploy/grafana/gpufleet-serving.json with data.

Usage: serving_e2e_test.py path/to/gpufleet [test-name ...]"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.client import HTTPConnection, HTTPException

from e2e_testlib import (Cluster, Process, api, check, die_with_parent, http,
                         kill_recorded_workloads, prometheus_query, run_tests, wait_until)
from agent_testlib import free_port

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SERVER_SCRIPT = os.path.join(REPO, "examples", "model-server", "gpufleet_reference_server.py")
TORCH_PYTHON = "/usr/bin/python3"  # Debian's interpreter, where python3-torch is installed


class Dev:
    """`gpufleet dev` in a temporary directory, on free loopback ports."""

    def __init__(self, gpufleet, name):
        self.gpufleet = gpufleet
        self.root = tempfile.mkdtemp(prefix=f"gpufleet-serving-{name}-")
        self.dir = os.path.join(self.root, "cluster")
        # A loopback address of its own for the node: replicas listen there, so tests running
        # side by side never answer each other's probes or requests.
        self.address = f"127.{os.getpid() % 250 + 1}.{sum(map(ord, name)) % 250 + 1}.1"
        self.process = Process([gpufleet, "dev", "--dir", self.dir, "--listen", "127.0.0.1:0",
                                "--gateway-listen", "127.0.0.1:0", "--agent-listen",
                                f"{self.address}:0", "--sim-gpus", "4xH100-80GB"],
                               os.path.join(self.root, "dev.log"), "gpufleet dev")
        self.api = self.process.read_until(r"API\s+(http://[\d.:]+)/api/v1").group(1)
        self.gateway = self.process.read_until(r"gateway\s+(http://[\d.:]+)").group(1)
        with open(os.path.join(self.dir, "client.json")) as file:
            self.admin = json.load(file)["token"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.process.poll() is None:
            self.process.process.kill()
        kill_recorded_workloads(os.path.join(self.dir, "agent"))
        if exc[0] is None:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            print(f"kept {self.root} for inspection", file=sys.stderr)
        return False

    def token(self, user, team):
        status, body = api(self.api, self.admin, "POST", "/api/v1/tokens",
                           {"user": user, "team": team, "role": "user"})
        check(status == 201, f"token: HTTP {status}: {body}")
        return body["token"]

    def deploy(self, spec, token):
        path = os.path.join(self.root, f"{spec['name']}.json")
        with open(path, "w") as file:
            json.dump(spec, file)
        result = subprocess.run([self.gpufleet, "deploy", "-f", path], capture_output=True,
                                text=True, timeout=30,
                                env=dict(os.environ, GPUFLEET_SERVER=self.api,
                                         GPUFLEET_TOKEN=token))
        check(result.returncode == 0, f"deploy: {result.stdout!r} {result.stderr!r}")
        return result.stdout

    def cli(self, *args, token=None):
        result = subprocess.run([self.gpufleet, *args], capture_output=True, text=True,
                                timeout=30, env=dict(os.environ, GPUFLEET_SERVER=self.api,
                                                     GPUFLEET_TOKEN=token or self.admin))
        check(result.returncode == 0, f"gpufleet {' '.join(args)}: {result.stderr!r}")
        return result.stdout

    def deployment(self, name, token=None):
        status, body = api(self.api, token or self.admin, "GET", f"/api/v1/deployments/{name}")
        check(status == 200, f"deployment {name}: HTTP {status}: {body}")
        return body

    def ready(self, name, count, timeout=60):
        return wait_until(lambda: (lambda d: d if d["ready_replicas"] == count and len(
            d["replicas"]) == count else None)(self.deployment(name)), timeout,
            f"{count} ready replica(s) of {name}")


def model(name, **fields):
    spec = {"name": name, "command": [TORCH_PYTHON, SERVER_SCRIPT, "--max-num-seqs", "4"],
            "gpus": 0.25, "readiness_path": "/health", "routing": "least_outstanding",
            "models": [name]}
    spec.update(fields)
    return spec


def complete(gateway, token, body, timeout=60):
    """(status, parsed JSON or text) of POST /v1/completions through the gateway."""
    status, text = http("POST", gateway + "/v1/completions", body, token, timeout)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def stream(gateway, token, body, started=None, timeout=60):
    """Streams a completion; returns (chunks received, ended with [DONE])."""
    host, port = gateway.removeprefix("http://").split(":")
    connection = HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                           {"Authorization": "Bearer " + token,
                            "Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return 0, False
        chunks, done = 0, False
        while True:
            line = response.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                chunks += 1
                if chunks == 1 and started:
                    started.release()
        return chunks, done
    except (OSError, HTTPException):
        return -1, False
    finally:
        connection.close()


def replica_pids(deployment):
    """Replica id ("j42") -> pid of its model server, found by the environment gpufleet set."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                env = dict(item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                cmdline = file.read()
        except OSError:
            continue
        if env.get(b"GPUFLEET_DEPLOYMENT") == deployment.encode() and b"reference_server" in cmdline:
            pids[env[b"GPUFLEET_REPLICA"].decode()] = int(entry)
    return pids


def replica_metric(host, port, name):
    status, text = http("GET", f"http://{host}:{port}/metrics")
    check(status == 200, f"replica metrics: HTTP {status}")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_scale_from_zero_and_refusals(gpufleet):
    with Dev(gpufleet, "zero") as dev:
        alice = dev.token("alice", "vision")
        bob = dev.token("bob", "speech")
        out = dev.deploy(model("tiny", command=[TORCH_PYTHON, SERVER_SCRIPT, "--load-delay", "2"],
                               min_replicas=0, max_replicas=2,
                               autoscaling={"scale_to_zero_grace": "5s",
                                            "stable_window": "10s"}), alice)
        check("created" in out and "0 replica(s) wanted" in out, f"deploy said {out!r}")
        check(dev.deployment("tiny")["replicas"] == [], "a replica before any request")

        # The first request waits in the gateway's buffer through the cold start (>= the 2 s
        # load delay) and is answered by the replica the autoscaler started for it.
        started = time.monotonic()
        status, body = complete(dev.gateway, alice, {"model": "tiny", "prompt": "hello",
                                                     "max_tokens": 4})
        elapsed = time.monotonic() - started
        check(status == 200, f"first request: HTTP {status}: {body}")
        check(body["choices"][0]["text"] is not None and body["usage"]["completion_tokens"] == 4,
              f"completion: {body}")
        check(elapsed >= 2, f"answered in {elapsed:.2f} s: not through a cold start")
        deployment = dev.deployment("tiny")
        check(deployment["ready_replicas"] == 1, f"after the first request: {deployment}")

        # The OpenAI model list is the caller's team's; bad input is refused clearly.
        status, text = http("GET", dev.gateway + "/v1/models", token=alice)
        check(status == 200 and "tiny" in [m["id"] for m in json.loads(text)["data"]],
              f"/v1/models: {status} {text}")
        status, text = http("GET", dev.gateway + "/v1/models", token=bob)
        check(status == 200 and json.loads(text)["data"] == [], f"bob's /v1/models: {text}")
        status, _ = complete(dev.gateway, alice, {"model": "nope", "prompt": "x"})
        check(status == 404, f"unknown model: HTTP {status}")
        status, _ = complete(dev.gateway, bob, {"model": "tiny", "prompt": "x"})
        check(status == 404, f"another team's deployment: HTTP {status}")
        status, _ = complete(dev.gateway, alice, '{"model": "tiny", "prompt": ')
        check(status == 400, f"bad JSON: HTTP {status}")
        status, _ = complete(dev.gateway, None, {"model": "tiny", "prompt": "x"})
        check(status == 401, f"no token: HTTP {status}")
        status, _ = complete(dev.gateway, "gpf_" + "0" * 64, {"model": "tiny", "prompt": "x"})
        check(status == 401, f"unknown token: HTTP {status}")
        # Also by path prefix, to the replica's own routes.
        status, text = http("GET", dev.gateway + "/d/tiny/v1/models", token=alice)
        check(status == 200 and "tiny" in text, f"/d/tiny/v1/models: {status} {text}")

        # No traffic: back to zero after the stable window and the grace period.
        wait_until(lambda: dev.deployment("tiny")["replicas"] == [], 120, "scale to zero")


def test_load_spreads_and_a_killed_replica_fails_only_its_own(gpufleet):
    with Dev(gpufleet, "spread") as dev:
        dev.deploy(model("tiny", min_replicas=3, max_replicas=3), dev.admin)
        dev.ready("tiny", 3)
        status, endpoints = api(dev.api, dev.admin, "GET", "/api/v1/endpoints")
        check(status == 200, f"endpoints: {status}")
        replicas = endpoints["deployments"][0]["endpoints"]
        check(len(replicas) == 3, f"endpoints: {replicas}")
        wait_until(lambda: len(replica_pids("tiny")) == 3, 10, "3 replica processes")

        # Load from 6 clients at once: every replica gets a share.
        errors = []

        def client():
            for _ in range(5):
                status, body = complete(dev.gateway, dev.admin,
                                        {"model": "tiny", "prompt": "spread", "max_tokens": 2})
                if status != 200:
                    errors.append((status, body))

        threads = [threading.Thread(target=client) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        check(not errors, f"failed requests: {errors[:3]}")
        served = {r["id"]: replica_metric(r["host"], r["port"], "vllm:request_success_total")
                  for r in replicas}
        check(sum(served.values()) == 30 and min(served.values()) >= 3,
              f"requests per replica: {served}")

        # Six long streams, two per replica (least outstanding); kill one replica mid-stream.
        started = threading.Semaphore(0)
        results = []
        body = {"model": "tiny", "prompt": "stream", "max_tokens": 400, "temperature": 0}

        def streamer():
            results.append(stream(dev.gateway, dev.admin, body, started))

        threads = [threading.Thread(target=streamer) for _ in range(6)]
        for thread in threads:
            thread.start()
        for _ in threads:
            check(started.acquire(timeout=30), "a stream never started")
        running = {r["id"]: replica_metric(r["host"], r["port"], "vllm:num_requests_running")
                   for r in replicas}
        victim = max(running, key=running.get)
        in_flight = int(running[victim])
        check(in_flight >= 1, f"running per replica: {running}")
        os.kill(replica_pids("tiny")[victim], signal.SIGKILL)
        for thread in threads:
            thread.join()
        failed = [result for result in results if not result[1]]
        check(len(failed) == in_flight,
              f"{len(failed)} stream(s) failed, {in_flight} were on the killed replica: {results}")

        # The next requests go to the live replicas (and the dead one is replaced).
        for _ in range(10):
            status, body = complete(dev.gateway, dev.admin,
                                    {"model": "tiny", "prompt": "after", "max_tokens": 2})
            check(status == 200, f"after the kill: HTTP {status}: {body}")
        dev.ready("tiny", 3)


class SteadyLoad:
    """Clients sending requests back to back until stopped; counts every failure."""

    def __init__(self, gateway, token, clients=3):
        self.gateway, self.token = gateway, token
        self.stopping = threading.Event()
        self.ok, self.failures = 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def run(self):
        while not self.stopping.is_set():
            status, body = complete(self.gateway, self.token,
                                    {"model": "tiny", "prompt": "steady", "max_tokens": 8})
            with self.lock:
                if status == 200:
                    self.ok += 1
                else:
                    self.failures.append((status, body))

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join()


def test_scale_down_and_rolling_update_lose_nothing(gpufleet):
    with Dev(gpufleet, "roll") as dev:
        spec = model("tiny", min_replicas=2, max_replicas=2)
        dev.deploy(spec, dev.admin)
        dev.ready("tiny", 2)
        load = SteadyLoad(dev.gateway, dev.admin)
        try:
            time.sleep(2)
            # Scale down: one replica leaves the endpoints, finishes what it serves, then stops.
            dev.cli("scale", "tiny", "1")
            dev.ready("tiny", 1)
            dev.cli("scale", "tiny", "--auto")
            dev.ready("tiny", 2)
            before = {r["job_id"] for r in dev.deployment("tiny")["replicas"]}
            # A rolling update: a new generation replaces each replica, one by one.
            spec["env"] = {"VERSION": "2"}
            out = dev.deploy(spec, dev.admin)
            check("generation 2" in out, f"deploy said {out!r}")
            wait_until(lambda: (lambda d: d if len(d["replicas"]) == 2 and all(
                r["generation"] == 2 and r["state"] == "ready" for r in d["replicas"]) else None)(
                dev.deployment("tiny")), 120, "the rollout")
            after = {r["job_id"] for r in dev.deployment("tiny")["replicas"]}
            check(not before & after, f"replicas before {before}, after {after}")
            time.sleep(2)
        finally:
            load.stop()
        check(load.ok > 20, f"only {load.ok} requests answered under load")
        check(not load.failures,
              f"{len(load.failures)} of {load.ok + len(load.failures)} requests failed: "
              f"{load.failures[:3]}")


def test_gateway_of_a_server_and_agents(gpufleet):
    """The multi-machine shape: `gpufleet server`, agents on two loopback addresses, and a
    separate `gpufleet gateway --server` with a gateway token."""
    with Cluster(gpufleet, "gateway") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a", address="127.0.0.2")
        cluster.start_agent("node-b", address="127.0.0.3")
        gateway = cluster.start_gateway()
        gateway_token, url = gateway.token, gateway.url
        try:
            alice = cluster.token("alice", "vision")
            status, body = api(cluster.url, alice, "POST", "/api/v1/deployments", {
                "name": "static", "gpus": 3, "min_replicas": 2, "max_replicas": 2,
                "readiness_path": "/",
                "command": ["sh", "-c", 'echo "replica on $HOST" > index.html; '
                            'exec python3 -m http.server "$PORT" --bind "$HOST"']})
            check(status == 201, f"deploy: HTTP {status}: {body}")
            wait_until(lambda: api(cluster.url, alice, "GET", "/api/v1/deployments/static")[1]
                       .get("ready_replicas") == 2, 60, "2 ready replicas")
            hosts = set()

            def answered():
                status, text = http("GET", url + "/d/static/", token=alice)
                if status == 200:
                    hosts.add(text.strip())
                return len(hosts) == 2

            # 3 GPUs a replica on 4-GPU nodes: one replica per node, each listening on its
            # node's address, and the gateway reaches both.
            wait_until(answered, 30, f"answers from both nodes' replicas (so far {hosts})")
            check(hosts == {"replica on 127.0.0.2", "replica on 127.0.0.3"}, f"answers: {hosts}")
            status, _ = http("GET", url + "/d/static/", token=gateway_token)
            check(status == 401, f"the gateway's own token calling a model: HTTP {status}")
            status, _ = http("GET", url + "/d/static/")
            check(status == 401, f"no token: HTTP {status}")
            # Its metrics name every team's deployments: an admin's token only.
            status, _ = http("GET", url + "/metrics", token=alice)
            check(status == 403, f"a user reading the gateway's metrics: HTTP {status}")
            status, text = http("GET", url + "/metrics", token=cluster.admin_token)
            check(status == 200 and 'deployment="static"' in text, f"gateway metrics: {status}")
        finally:
            gateway.stop()


# A replica for the dashboard test: plain answers, an SSE stream (the gateway's TTFT histogram
# counts text/event-stream answers only) and 503s (upstream errors, retries and ejections).
DASHBOARD_REPLICA = r"""
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        status, kind, body = 200, "text/plain", b"ok\n"
        if self.path.startswith("/fail"):
            status, body = 503, b"unavailable\n"
        elif self.path.startswith("/stream"):
            kind, body = "text/event-stream", b"data: {}\n\ndata: [DONE]\n\n"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])),
                                Handler).serve_forever()
"""


def test_serving_dashboard_in_prometheus(gpufleet):
    """A real Prometheus (Debian's) scrapes a server and a `gpufleet gateway --server` carrying
    plain, streamed and failing requests: every query of deploy/grafana/gpufleet-serving.json is
    valid PromQL that returns data, with the gateway and the server as two scrape jobs."""
    prometheus = "/usr/bin/prometheus"
    check(os.access(prometheus, os.X_OK),
          f"{prometheus} is missing (Debian package 'prometheus'; `make deps` installs it)")
    with Cluster(gpufleet, "serving-dashboard") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a")
        gateway = cluster.start_gateway("--eject-after", "2")
        url = gateway.url
        server = None
        try:
            alice = cluster.token("alice", "vision")
            status, body = api(cluster.url, alice, "POST", "/api/v1/deployments", {
                "name": "chat", "gpus": 1, "min_replicas": 2, "max_replicas": 2,
                "readiness_path": "/", "command": ["python3", "-c", DASHBOARD_REPLICA]})
            check(status == 201, f"deploy: HTTP {status}: {body}")
            wait_until(lambda: api(cluster.url, alice, "GET", "/api/v1/deployments/chat")[1]
                       .get("ready_replicas") == 2, 60, "2 ready replicas")
            wait_until(lambda: http("GET", url + "/d/chat/", token=alice)[0] == 200, 30,
                       "the gateway routing to chat")

            # The gateway's metrics name every team's deployments: an admin's token only.
            admin_token_file = os.path.join(cluster.root, "prometheus-gateway.token")
            with open(admin_token_file, "w") as file:
                file.write(cluster.admin_token + "\n")
            config = os.path.join(cluster.root, "prometheus.yml")
            port = free_port()
            with open(config, "w") as file:
                file.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpufleet-server
    static_configs:
      - targets: ['{cluster.url.removeprefix("http://")}']
  - job_name: gateway
    authorization:
      credentials_file: {admin_token_file}
    static_configs:
      - targets: ['{url.removeprefix("http://")}']
""")
            log = open(os.path.join(cluster.root, "prometheus.log"), "wb")
            server = subprocess.Popen(
                [prometheus, f"--config.file={config}",
                 f"--storage.tsdb.path={os.path.join(cluster.root, 'tsdb')}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
            prom = f"http://127.0.0.1:{port}"

            def prometheus_ready():
                try:
                    return http("GET", prom + "/-/ready", timeout=2)[0] == 200
                except OSError:
                    return False

            wait_until(prometheus_ready, 30, "Prometheus ready")
            deadline = time.time() + 20
            while True:
                # Traffic all along, so that every rate sees it between two scrapes.
                for path in ("/d/chat/", "/d/chat/stream", "/d/chat/fail"):
                    http("GET", url + path, token=alice)
                if time.time() > deadline:
                    check(False, "three scrapes of each job in Prometheus")
                counts = prometheus_query(prom, "count_over_time(up[1m]) >= 4")
                if len(counts) == 2:
                    break
                time.sleep(0.2)
            path = os.path.join(REPO, "deploy", "grafana", "gpufleet-serving.json")
            with open(path) as file:
                dashboard = json.load(file)
            queried = 0
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expression = target["expr"].replace("$deployment", ".*")
                    result = prometheus_query(prom, expression)
                    check(result and any(entry["value"][1] != "NaN" for entry in result),
                          f"dashboard panel '{panel['title']}': no data for {expression}: "
                          f"{result}")
                    queried += 1
            check(queried >= 20, f"only {queried} dashboard queries")
            # The job names of deploy/prometheus/prometheus.yml.
            with open(os.path.join(REPO, "deploy", "prometheus", "prometheus.yml")) as file:
                shipped = file.read()
            for job in ("gpufleet-server", "gateway"):
                check(f"job_name: {job}\n" in shipped, f"prometheus.yml has no job {job}")
        finally:
            if server:
                server.terminate()
                try:
                    server.wait(10)
                except subprocess.TimeoutExpired:
                    server.kill()
            gateway.stop()


TESTS = [test_scale_from_zero_and_refusals,
         test_gateway_of_a_server_and_agents,
         test_load_spreads_and_a_killed_replica_fails_only_its_own,
         test_scale_down_and_rolling_update_lose_nothing,
         test_serving_dashboard_in_prometheus]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
