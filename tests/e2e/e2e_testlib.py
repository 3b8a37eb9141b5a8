"""Helpers for the end-to-end tests of the whole platform: the real `gpufleet server` and
`gpufleet agent` binaries (several agents on separate loopback addresses), the real CLI, HTTP
to the API with tokens, and cleanup that leaves no process behind."""

import json
import os
import re
import select
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from agent_testlib import (TestFailure, check, die_with_parent, exit_on_termination,  # noqa: E402,F401
                           kill_recorded_workloads, wait_until)

URL_PATTERN = re.compile(r"(https?://\d+\.\d+\.\d+\.\d+:\d+)")

# The CA that https:// test servers' certificates chain to (set by a Cluster started with TLS).
TLS_CONTEXTS = {}


class Process:
    """A gpufleet daemon whose first stdout lines name its address."""

    def __init__(self, args, log_path, name):
        self.args = args
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log,
                                        preexec_fn=die_with_parent)
        self.output = ""

    def read_until(self, pattern, timeout=20):
        """Reads stdout until `pattern` matches; returns the match."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while True:
            match = re.search(pattern, self.output)
            if match:
                return match
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TestFailure(f"{self.name}: no {pattern!r} within {timeout} s; output so far:"
                                  f" {self.output!r}; log: {self.log_tail()}")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise TestFailure(f"{self.name} exited (code {self.process.wait(5)}) early; "
                                  f"output: {self.output!r}; log: {self.log_tail()}")
            self.output += chunk.decode(errors="replace")

    def log_tail(self):
        try:
            with open(self.log_path, "rb") as log:
                return log.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise TestFailure(f"{self.name} did not stop within {timeout} s of {sig!r}")
        finally:
            self.log.close()


class Cluster:
    """A server and any number of agents under one temporary directory."""

    def __init__(self, gpufleet, name, server_args=(), tls=False):
        self.gpufleet = gpufleet
        self.root = tempfile.mkdtemp(prefix=f"gpufleet-e2e-{name}-")
        self.server_args = list(server_args)
        self.ca_file = None
        if tls:
            self.ca_file, key = self.make_certificate()
            # The agents serve HTTPS with the same certificate (it names 127.0.0.1): the server
            # reads their logs over TLS, trusting that CA.
            self.tls_key = key
            self.server_args += ["--tls-cert", self.ca_file, "--tls-key", key,
                                 "--agent-ca-file", self.ca_file]
        self.server = None
        self.url = ""
        self.admin_token = ""
        self.agents = {}
        self.agent_dirs = []
        self.gateways = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for process in [*self.agents.values(), *self.gateways]:
            if process.process.poll() is None:
                process.process.kill()
        if self.server and self.server.process.poll() is None:
            self.server.process.kill()
        for data_dir in self.agent_dirs:
            kill_recorded_workloads(data_dir)
        remove_unless_failed(self.root, exc[0] is not None)
        return False

    def make_certificate(self):
        """A self-signed P-256 certificate for 127.0.0.1 (it is its own CA)."""
        cert, key = os.path.join(self.root, "server.crt"), os.path.join(self.root, "server.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        "/CN=gpufleet-e2e", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        return cert, key

    def start_server(self, port=0):
        data_dir = os.path.join(self.root, "server")
        self.server = Process([self.gpufleet, "server", "--data-dir", data_dir,
                               "--listen", f"127.0.0.1:{port}", *self.server_args],
                              os.path.join(self.root, "server.log"), "server")
        self.url = self.server.read_until(URL_PATTERN).group(1)
        if self.ca_file:
            TLS_CONTEXTS[self.url] = ssl.create_default_context(cafile=self.ca_file)
        wait_until(lambda: http("GET", self.url + "/readyz")[0] == 200, 20, "server ready")
        token_file = os.path.join(data_dir, "admin-token")
        with open(token_file) as file:
            self.admin_token = file.read().strip()
        check(self.admin_token.startswith("gpf_"), f"odd admin token in {token_file}")
        return self.server

    def kill_server(self):
        self.server.process.kill()
        self.server.process.wait(10)
        self.server.log.close()

    def token(self, user, team, role="user"):
        status, body = api(self.url, self.admin_token, "POST", "/api/v1/tokens",
                           {"user": user, "team": team, "role": role})
        check(status == 201, f"creating a token for {user}: HTTP {status}: {body}")
        return body["token"]

    def start_agent(self, name, address="127.0.0.1", gpus="4xH100-80GB", token=None,
                    extra_args=(), wrapper=()):
        """gpus None: no --sim-gpus (NVML, e.g. --nvml-library in extra_args). wrapper: a command
        the agent's argv is appended to (it must exec it, so the pid stays the agent's)."""
        data_dir = os.path.join(self.root, f"agent-{name}")
        if data_dir not in self.agent_dirs:
            self.agent_dirs.append(data_dir)
        token = token or self.token(f"agent-{name}", "system", "agent")
        token_file = os.path.join(self.root, f"agent-{name}.token")
        with open(token_file, "w") as file:
            file.write(token + "\n")
        agent = Process([*wrapper, self.gpufleet, "agent", "--server", self.url,
                         "--token-file", token_file, *(["--sim-gpus", gpus] if gpus else []),
                         "--hostname", name, "--listen", f"{address}:0",
                         "--address", address, "--data-dir", data_dir,
                         # The tests' files live in root's 0700 temp dirs: workloads run as the
                         # agent's user unless a test asks for another (extra_args win).
                         *([] if "--workload-user" in extra_args else
                           ["--workload-user", "agent"]),
                         # ... and see the node's /tmp, where the tests' files are.
                         *([] if "--workload-isolation" in extra_args else
                           ["--workload-isolation", "none"]),
                         *(["--ca-file", self.ca_file, "--tls-cert", self.ca_file,
                            "--tls-key", self.tls_key] if self.ca_file else []), *extra_args],
                        os.path.join(self.root, f"agent-{name}.log"), f"agent {name}")
        agent.url = agent.read_until(r"listening on (https?://[\d.:]+)").group(1)
        agent.data_dir = data_dir
        self.agents[name] = agent
        wait_until(lambda: any(node["report"]["name"] == name and node["state"] == "ready"
                               for node in self.nodes()), 20, f"node {name} ready")
        return agent

    def start_gateway(self, *extra_args):
        """A `gpufleet gateway --server` with a gateway token of its own (`.token`), listening on
        loopback at `.url`."""
        token = self.token(f"gw-{len(self.gateways) + 1}", "", "gateway")
        token_file = os.path.join(self.root, f"gateway-{len(self.gateways) + 1}.token")
        with open(token_file, "w") as file:
            file.write(token + "\n")
        gateway = Process([self.gpufleet, "gateway", "--server", self.url, "--token-file",
                           token_file, "--listen", "127.0.0.1:0", *extra_args],
                          os.path.join(self.root, f"gateway-{len(self.gateways) + 1}.log"),
                          "gateway")
        self.gateways.append(gateway)
        gateway.url = gateway.read_until(r"listening on (http://[\d.:]+)").group(1)
        gateway.token = token
        return gateway

    def nodes(self):
        status, body = api(self.url, self.admin_token, "GET", "/api/v1/nodes")
        check(status == 200, f"GET nodes: HTTP {status}: {body}")
        return body["nodes"]

    def submit(self, job, token=None):
        status, body = api(self.url, token or self.admin_token, "POST", "/api/v1/jobs", job)
        check(status == 201, f"submit: HTTP {status}: {body}")
        return body

    def job(self, job_id, token=None):
        status, body = api(self.url, token or self.admin_token, "GET", f"/api/v1/jobs/{job_id}")
        check(status == 200, f"GET job {job_id}: HTTP {status}: {body}")
        return body

    def wait_state(self, job_id, states, timeout=30):
        states = {states} if isinstance(states, str) else set(states)
        return wait_until(lambda: (lambda job: job if job["state"] in states else None)(
            self.job(job_id)), timeout, f"job {job_id} to be {'/'.join(sorted(states))}")

    def logs(self, job_id, task=0, stream="stdout", token=None):
        request = urllib.request.Request(
            f"{self.url}/api/v1/jobs/{job_id}/logs?task={task}&stream={stream}&offset=0")
        request.add_header("Authorization", "Bearer " + (token or self.admin_token))
        with urllib.request.urlopen(request, timeout=10,
                                    context=context_for(self.url)) as response:
            return response.read().decode(errors="replace")

    def cli(self, *args, token=None, check_code=0, timeout=30):
        env = dict(os.environ, GPUFLEET_SERVER=self.url,
                   GPUFLEET_TOKEN=token or self.admin_token)
        if self.ca_file:
            env["GPUFLEET_CA_FILE"] = self.ca_file
        result = subprocess.run([self.gpufleet, *args], env=env, capture_output=True, text=True,
                                timeout=timeout, cwd=self.root)
        if check_code is not None:
            check(result.returncode == check_code,
                  f"gpufleet {' '.join(args)}: exit {result.returncode}, wanted {check_code}; "
                  f"stdout {result.stdout!r}; stderr {result.stderr!r}")
        return result


def remove_unless_failed(root, failed):
    """A test's directory goes when it passed; a failed one's is kept, and said where."""
    if failed:
        print(f"kept {root} for inspection", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


class SubmitLoad:
    """`workers` clients submitting 1-GPU jobs named w<worker>-<n> to `url` until stop();
    `acknowledged` lists (id, name) of each answered 201. A client stops when the server is gone:
    what it did not answer it did not promise."""

    def __init__(self, url, token, workers):
        self.acknowledged = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._submit, args=(url, token, worker))
                         for worker in range(workers)]
        for thread in self._threads:
            thread.start()

    def _submit(self, url, token, worker):
        n = 0
        while not self._stop.is_set():
            try:
                status, body = api(url, token, "POST", "/api/v1/jobs",
                                   {"command": ["true"], "gpus": 1, "name": f"w{worker}-{n}"},
                                   timeout=5)
            except OSError:
                return
            if status == 201:
                with self._lock:
                    self.acknowledged.append((body["id"], body["spec"]["name"]))
            n += 1

    def count(self):
        with self._lock:
            return len(self.acknowledged)

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def context_for(url):
    """The TLS context trusting the test CA of the server at `url` (None for http://)."""
    return next((context for base, context in TLS_CONTEXTS.items() if url.startswith(base)),
                None)


def http(method, url, body=None, token=None, timeout=10):
    """Returns (status, text); 4xx/5xx are answers, not exceptions."""
    data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=timeout,
                                    context=context_for(url)) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def api(base, token, method, path, body=None, timeout=10):
    status, text = http(method, base + path, body, token, timeout)
    try:
        return status, json.loads(text) if text else {}
    except ValueError:
        return status, {"raw": text}


def prometheus_query(url, expression):
    """The result vector of an instant query to the Prometheus at `url`."""
    status, text = http("GET", url + "/api/v1/query?" +
                        urllib.parse.urlencode({"query": expression}), timeout=5)
    check(status == 200, f"query {expression}: HTTP {status}: {text}")
    answer = json.loads(text)
    check(answer.get("status") == "success", f"query {expression}: {answer}")
    return answer["data"]["result"]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def run_tests(tests):
    """Runs each test function with the binary's path; prints a line each; exits 1 on failure."""
    exit_on_termination()
    gpufleet = os.path.abspath(sys.argv[1])
    failures = 0
    for test in tests:
        started = time.monotonic()
        try:
            test(gpufleet)
            print(f"PASS {test.__name__} ({time.monotonic() - started:.1f} s)", flush=True)
        except Exception as error:  # noqa: BLE001 - report every kind of failure, then go on
            failures += 1
            print(f"FAIL {test.__name__}: {type(error).__name__}: {error}", flush=True)
    sys.exit(1 if failures else 0)
