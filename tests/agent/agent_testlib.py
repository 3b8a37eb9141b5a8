"""Helpers for the agent's end-to-end tests: start the real `gpufleet agent` on a loopback port
0, talk HTTP to it, wait on conditions with deadlines, and leave no process behind."""

import glob
import json
import os
import select
import signal
import subprocess
import time
import urllib.error
import urllib.request


class TestFailure(Exception):
    pass


def die_with_parent():
    """preexec_fn: the child gets SIGKILL if the test process dies (a ctest timeout), so no
    agent or Prometheus outlives a killed test."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_on_termination():
    """SIGTERM/SIGINT end the test through its `finally` blocks, which stop what it started."""
    def handler(signum, _frame):
        raise SystemExit(f"terminated by signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def check(condition, message):
    if not condition:
        raise TestFailure(message)


def wait_until(predicate, timeout, what):
    """Polls predicate() until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, KeyError, TestFailure) as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise TestFailure(f"timed out after {timeout} s waiting for {what}"
                              + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(0.05)


def http(method, url, body=None, timeout=10):
    """Returns (status, body text); 4xx/5xx are answers, not exceptions."""
    data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def get_json(url):
    status, text = http("GET", url)
    check(status == 200, f"GET {url}: HTTP {status}: {text}")
    return json.loads(text)


class Agent:
    """A `gpufleet agent` daemon on 127.0.0.1:0; the address comes from its startup line."""

    def __init__(self, gpufleet, data_dir, log_path, extra_args=()):
        self.args = [gpufleet, "agent", "--standalone", "--sim-gpus", "8xH100-80GB",
                     "--hostname", "e2e-node", "--listen", "127.0.0.1:0",
                     "--data-dir", data_dir,
                     # Workloads write into root's 0700 temp dirs: as the agent's own user.
                     *([] if "--workload-user" in extra_args else ["--workload-user", "agent"]),
                     # ... and see the node's /tmp, where the tests' files are.
                     *([] if "--workload-isolation" in extra_args
                       else ["--workload-isolation", "none"]),
                     *extra_args]
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log,
                                        preexec_fn=die_with_parent)
        self.startup = ""
        self.url = ""

    def wait_ready(self, timeout=15):
        """Reads the startup line (the caller has registered us for cleanup first)."""
        self.startup = self.read_line(timeout)
        check(self.startup.startswith("gpufleet agent "),
              f"unexpected startup line: {self.startup!r}")
        marker = "listening on http://"
        check(marker in self.startup, f"no address in the startup line: {self.startup!r}")
        self.url = "http://" + self.startup.split(marker, 1)[1].split(",", 1)[0]

    def read_line(self, timeout):
        deadline = time.monotonic() + timeout
        line = b""
        fd = self.process.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TestFailure(f"no output line from the agent within {timeout} s")
            chunk = os.read(fd, 1)
            if not chunk:
                raise TestFailure(
                    f"the agent exited (code {self.process.wait(5)}) before printing a line")
            line += chunk
        return line.decode().rstrip("\n")

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(5)
            raise TestFailure(f"the agent did not stop within {timeout} s of {sig!r}")
        finally:
            self.log.close()
        return code


def proc_start_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def kill_recorded_workloads(data_dir):
    """SIGKILLs the shims and workload process groups recorded under data_dir (checking the
    recorded start time, so a reused pid is never hit)."""
    for record in glob.glob(os.path.join(data_dir, "workloads", "*", "*")):
        name = os.path.basename(record)
        if name not in ("workload.pgid", "shim.pid"):
            continue
        try:
            with open(record) as file:
                entry = json.load(file)
        except (OSError, ValueError):
            continue
        pid = entry.get("pid", 0)
        if pid <= 0 or proc_start_ticks(pid) != entry.get("start_ticks"):
            continue
        try:
            if name == "workload.pgid":
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Containers outlive their shim, as they would on a node: remove the ones under data_dir.
    for spec_path in glob.glob(os.path.join(data_dir, "workloads", "*", "spec.json")):
        try:
            with open(spec_path) as file:
                spec = json.load(file)
        except (OSError, ValueError):
            continue
        if spec.get("container_id"):
            subprocess.run([spec["containers"]["runtime"], "delete", "--force",
                            spec["container_id"]], capture_output=True, timeout=30)


def free_port():
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_prometheus(prometheus, work, job_name, target):
    """Starts Debian's Prometheus under `work`, scraping http://`target`/metrics as `job_name`
    every second on loopback. Returns (process, url, log file); the caller stops the process."""
    port = free_port()
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as file:
        file.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {job_name}
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ['{target}']
""")
    log = open(os.path.join(work, "prometheus.log"), "wb")
    process = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    return process, f"http://127.0.0.1:{port}", log
