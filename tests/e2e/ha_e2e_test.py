"""Servers sharing one etcd (Debian's etcd-server, started here on loopback): one leads, the
others wait as standbys; a standby takes over when the leader is killed, with every acknowledged
job; a leader that stalled past its lease and comes back writes nothing (fencing) and exits.
docs/ha.md has the measured takeover times.

Usage: ha_e2e_test.py path/to/gpufleet [test-name ...]"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from e2e_testlib import (Process, SubmitLoad, api, check, die_with_parent, http,
                         remove_unless_failed, run_tests, wait_until)

ETCD = "/usr/bin/etcd"
LEASE_S = 2


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Etcd:
    """One etcd member on loopback with a data dir of its own."""

    def __init__(self, root):
        check(os.access(ETCD, os.X_OK),
              f"{ETCD} is missing (Debian package 'etcd-server'; `make deps` installs it)")
        self.client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.client}", f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(root, "etcd.log"), "ab")
        self.process = subprocess.Popen(
            [ETCD, "--name", "m0", "--data-dir", os.path.join(root, "etcd"),
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"m0={peer_url}", "--max-txn-ops", "20000",
             "--max-request-bytes", "67108864", "--logger", "zap", "--log-level", "error"],
            stdout=self.log, stderr=self.log, preexec_fn=die_with_parent)
        wait_until(lambda: http("GET", client_url + "/health")[0] == 200, 20, "etcd healthy")

    def stop(self):
        self.process.kill()
        self.process.wait(10)
        self.log.close()


class HaCluster:
    def __init__(self, gpufleet, name):
        self.gpufleet = gpufleet
        self.root = tempfile.mkdtemp(prefix=f"gpufleet-e2e-{name}-")
        self.etcd = Etcd(self.root)
        self.store = f"etcd://127.0.0.1:{self.etcd.client}/ha"
        self.servers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for server in self.servers:
            if server.process.poll() is None:
                server.process.kill()
        self.etcd.stop()
        remove_unless_failed(self.root, exc[0] is not None)
        return False

    def start_server(self, name, port=0):
        server = Process([self.gpufleet, "server", "--data-dir", os.path.join(self.root, name),
                          "--listen", f"127.0.0.1:{port}", "--store", self.store,
                          "--etcd-lease", f"{LEASE_S}s"],
                         os.path.join(self.root, f"{name}.log"), name)
        server.data_dir = os.path.join(self.root, name)
        self.servers.append(server)
        return server

    @staticmethod
    def url_of(server, timeout=20):
        return server.read_until(r"listening on (http://[\d.:]+)", timeout).group(1)

    def admin_token(self, server):
        path = os.path.join(server.data_dir, "admin-token")
        server.read_until(r"admin token: created")  # written once the store holds it
        wait_until(lambda: os.path.exists(path), 10, f"{path}")
        with open(path) as file:
            return file.read().strip()


def job_names(url, token):
    status, body = api(url, token, "GET", "/api/v1/jobs?limit=10000")
    check(status == 200, f"GET jobs: {status} {body}")
    return [job["spec"]["name"] for job in body["jobs"]]


def test_standby_takes_over_after_kill9_with_every_acknowledged_job(gpufleet):
    """Leader A under a steady submit load is killed with SIGKILL; standby B, which said it
    waits, takes over within the lease and serves every job A acknowledged, each once. An agent
    and the CLI given both servers follow by themselves, and the job the agent was running when A
    died runs on, untouched. B then stops with SIGTERM (its lease revoked) and standby C takes
    over at once."""
    with HaCluster(gpufleet, "ha-kill9") as cluster:
        port_a, port_b = free_port(), free_port()
        leader = cluster.start_server("a", port_a)
        url = cluster.url_of(leader)
        token = cluster.admin_token(leader)
        standby = cluster.start_server("b", port_b)
        standby.read_until(r"standby: etcd keys 'ha/' are in use by another gpufleet server")
        servers = f"http://127.0.0.1:{port_a},http://127.0.0.1:{port_b}"
        # The standby answers on its address: it says what it is, and redirects to the leader,
        # so the CLI given only the standby's URL submits and lists through it.
        standby.read_until(r"standby on 127\.0\.0\.1:\d+: clients are redirected to the leader")
        status, text = http("GET", f"http://127.0.0.1:{port_b}/healthz")
        health = json.loads(text)
        check(status == 503 and health["role"] == "standby"
              and health["leader_url"] == f"http://127.0.0.1:{port_a}", f"standby: {health}")
        # An agent's sync carries its report (up to 1,000 finished workloads): a standby must
        # answer it as a standby, whatever its size, or the agent never moves on to the leader.
        big_report = {"node": {"name": "n"}, "workloads": [{"id": f"w{i}", "state": "exited",
                                                             "detail": "x" * 200}
                                                            for i in range(1000)]}
        status, text = http("POST", f"http://127.0.0.1:{port_b}/api/v1/agents/sync", big_report)
        check(status in (307, 503) and "413" not in text,
              f"a standby given a large sync: {status} {text[:200]}")
        via_standby = dict(os.environ, GPUFLEET_SERVER=f"127.0.0.1:{port_b}", GPUFLEET_TOKEN=token)
        submitted = subprocess.run([gpufleet, "submit", "--name", "via-standby", "--", "true"],
                                   capture_output=True, text=True, timeout=30, cwd=cluster.root,
                                   env=via_standby)
        check(submitted.returncode == 0, f"submit through the standby: {submitted}")
        check("via-standby" in job_names(url, token), "the leader lacks the redirected job")
        listed = subprocess.run([gpufleet, "jobs"], capture_output=True, text=True, timeout=30,
                                cwd=cluster.root, env=via_standby)
        check(listed.returncode == 0 and "via-standby" in listed.stdout, f"jobs: {listed}")
        status, body = api(url, token, "POST", "/api/v1/tokens",
                           {"user": "agent-n", "team": "system", "role": "agent"})
        check(status == 201, f"agent token: {status} {body}")
        token_file = os.path.join(cluster.root, "agent.token")
        with open(token_file, "w") as file:
            file.write(body["token"] + "\n")
        agent = Process([gpufleet, "agent", "--server", servers, "--token-file", token_file,
                         "--sim-gpus", "2xH100-80GB", "--hostname", "node-n", "--listen",
                         "127.0.0.1:0", "--data-dir", os.path.join(cluster.root, "agent"),
                         "--workload-user", "agent", "--workload-isolation", "none"],
                        os.path.join(cluster.root, "agent.log"), "agent")
        cluster.servers.append(agent)
        agent.read_until(r"listening on")
        pid_file = os.path.join(cluster.root, "long.pid")
        status, long_job = api(url, token, "POST", "/api/v1/jobs", {
            "command": ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 120"], "gpus": 1,
            "name": "long"})
        check(status == 201, f"long job: {status} {long_job}")
        wait_until(lambda: os.path.exists(pid_file) and open(pid_file).read().strip(), 20,
                   "the long job to start")
        long_pid = int(open(pid_file).read())
        load = SubmitLoad(url, token, 4)
        wait_until(lambda: load.count() >= 100, 30, "100 acknowledged submissions")
        leader.process.kill()
        killed = time.monotonic()
        load.stop()
        acknowledged = [name for _, name in load.acknowledged]
        new_url = cluster.url_of(standby, timeout=LEASE_S + 15)
        took_over = time.monotonic() - killed
        names = job_names(new_url, token)
        check(sorted(set(names)) == sorted(names), "a job is listed twice")
        missing = set(acknowledged) - set(names)
        check(not missing, f"{len(missing)} acknowledged jobs lost, e.g. {sorted(missing)[:3]}")
        status, body = api(new_url, token, "POST", "/api/v1/jobs",
                           {"command": ["true"], "gpus": 1, "name": "after"})
        check(status == 201, f"submitting to the new leader: {status} {body}")
        # The agent follows: B hears from node-n, and its running job was left alone.
        wait_until(lambda: any(node["report"]["name"] == "node-n" and node["state"] == "ready"
                               for node in api(new_url, token, "GET", "/api/v1/nodes")[1]
                               ["nodes"]), 20, "node-n syncing with B")
        status, job = api(new_url, token, "GET", f"/api/v1/jobs/{long_job['id']}")
        check(job["state"] == "running" and job["attempt"] == 0, f"the long job on B: {job}")
        check(os.path.exists(f"/proc/{long_pid}"), "the long job's process was killed")
        # So does the CLI given both servers.
        listed = subprocess.run([gpufleet, "jobs", "--state", "running"], capture_output=True,
                                text=True, timeout=30, cwd=cluster.root,
                                env=dict(os.environ, GPUFLEET_SERVER=servers,
                                         GPUFLEET_TOKEN=token))
        check(listed.returncode == 0 and "long" in listed.stdout, f"gpufleet jobs: {listed}")
        print(f"  standby took over {took_over:.2f} s after the leader's SIGKILL (lease {LEASE_S}"
              f" s); {len(acknowledged)} acknowledged jobs all there, once each")

        third = cluster.start_server("c")
        third.read_until(r"standby:")
        standby.stop()
        stopped = time.monotonic()
        cluster.url_of(third, timeout=15)
        print(f"  after a SIGTERM the next standby took over in {time.monotonic() - stopped:.2f} s")


def test_a_leader_that_stalled_past_its_lease_writes_nothing(gpufleet):
    """Leader A is frozen (SIGSTOP) past its lease; standby B takes over and accepts a job. A,
    thawed, stores nothing: its next write is refused by etcd's compare on the lock (a 5xx), or
    it has already stopped on seeing its lease lapse; it exits with status 1 to become a standby
    under its supervisor."""
    with HaCluster(gpufleet, "ha-fence") as cluster:
        leader = cluster.start_server("a")
        url = cluster.url_of(leader)
        token = cluster.admin_token(leader)
        standby = cluster.start_server("b")
        standby.read_until(r"standby:")
        status, _ = api(url, token, "POST", "/api/v1/jobs",
                        {"command": ["true"], "gpus": 1, "name": "before"})
        check(status == 201, f"first submission: {status}")
        leader.process.send_signal(signal.SIGSTOP)
        new_url = cluster.url_of(standby, timeout=LEASE_S + 15)
        status, _ = api(new_url, token, "POST", "/api/v1/jobs",
                        {"command": ["true"], "gpus": 1, "name": "on-b"})
        check(status == 201, f"submission to B: {status}")
        leader.process.send_signal(signal.SIGCONT)
        # Thawed, it either answers 5xx (a commit fenced off by etcd) or has stopped already
        # (it saw its lease lapse first): it acknowledges nothing either way.
        try:
            status, body = api(url, token, "POST", "/api/v1/jobs",
                               {"command": ["true"], "gpus": 1, "name": "from-the-old-leader"},
                               timeout=15)
        except OSError as error:
            status, body = 599, str(error)
        check(status >= 500, f"the deposed leader acknowledged a write: {status} {body}")
        check(leader.process.wait(20) == 1, "the deposed leader did not exit with status 1")
        check(re.search(r"no longer holds the lock|another server may hold the lock", leader.log_tail()),
              f"the deposed leader's log: {leader.log_tail()}")
        names = job_names(new_url, token)
        check("from-the-old-leader" not in names and {"before", "on-b"} <= set(names),
              f"jobs on B: {names}")


TESTS = [test_standby_takes_over_after_kill9_with_every_acknowledged_job,
         test_a_leader_that_stalled_past_its_lease_writes_nothing]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
