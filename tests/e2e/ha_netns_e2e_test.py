"""Faults of the highly available control plane across a real network: a 3-member etcd cluster
(Debian's etcd-server), 3 `gpufleet server`s and 2 agents, each in a network namespace of its own
that this test creates, joined by veth pairs to one bridge (10.231.0.0/24, inside the
namespaces only). The test itself, the client, sits in another namespace on the same bridge.

Under a steady submit load, one fault after another, each healed before the next:
  - the leader killed with SIGKILL;
  - the leader cut off from all three etcd members (its supervisor, here the test, restarts it);
  - the leader cut off from both agents, for less than the node timeout;
  - an agent running a 2-GPU job cut off from every server past the node timeout;
  - an etcd follower member killed and restarted, then etcd's leader member;
  - each etcd member in turn silent to the servers;
  - the leader's wall clock stepped an hour forward and back (libfaketime), then a standby's an
    hour back before the leader is killed, so it leads with a clock in the past.
After each: every acknowledged job is there exactly once, a job that started did so once per
attempt, and the long job running since the start is untouched (same process, attempt 0).
docs/ha.md has the table.

A partition is one-way in the routing tables: the peers of the cut-off host get a blackhole
route to it, so what they send it is dropped, and the cut-off host hears nothing back (its
connects and calls time out, as across a broken switch).

Usage: ha_netns_e2e_test.py path/to/gpufleet"""

import collections
import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from e2e_testlib import (Process, SubmitLoad, api, check, kill_recorded_workloads,
                         remove_unless_failed, run_tests, wait_until)

ETCD = "/usr/bin/etcd"
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
LEASE_S = 3  # the default --etcd-lease
NODE_TIMEOUT_S = 10
HEARTBEAT_S = 2
SUBNET = "10.231.0"
CLONE_NEWNET = 0x40000000


def ip(*args):
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    check(result.returncode == 0, f"ip {' '.join(args)}: {result.stderr.strip()}")


class Network:
    """Namespaces on one bridge. Host n gets SUBNET.n; the bridge lives in a hub namespace."""

    def __init__(self):
        self.tag = f"gf{os.getpid() % 100000}"
        self.namespaces = []
        self.hosts = {}  # name -> (namespace, address)
        self.hub = self._namespace("hub")
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")

    def _namespace(self, name):
        namespace = f"{self.tag}-{name}"
        ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        return namespace

    def add_host(self, name, number):
        namespace = self._namespace(name)
        ip("-n", self.hub, "link", "add", f"v{number}", "type", "veth", "peer", "name", "eth0",
           "netns", namespace)
        ip("-n", self.hub, "link", "set", f"v{number}", "master", "br0", "up")
        address = f"{SUBNET}.{number}"
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        self.hosts[name] = (namespace, address)
        return address

    def address(self, name):
        return self.hosts[name][1]

    def run_in(self, name):
        """The argv prefix that runs a command in host `name`'s namespace."""
        return ["ip", "netns", "exec", self.hosts[name][0]]

    def enter(self, name):
        """Moves this process (its main thread, and every thread and child it starts after) into
        host `name`'s namespace."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.hosts[name][0]}", os.O_RDONLY)
        try:
            check(libc.setns(fd, CLONE_NEWNET) == 0, f"setns: errno {ctypes.get_errno()}")
        finally:
            os.close(fd)

    def cut_off(self, name, peers, heal=False):
        """What each of `peers` sends to `name` is dropped (or, heal: delivered again)."""
        for peer in peers:
            ip("-n", self.hosts[peer][0], "route", "del" if heal else "add", "blackhole",
               f"{self.address(name)}/32")

    def close(self):
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def http_json(method, url, body=None, token=None, timeout=5):
    """(status, parsed body, Location); a 3xx is an answer, not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else {}, None
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"raw": text}
        return error.code, parsed, error.headers.get("Location")


class Load(SubmitLoad):
    """Clients submitting short jobs to a list of servers, as the CLI does: a redirect from a
    standby is followed, an unreachable or failing server is passed over. Every name is sent
    once; a submission that got no 201 (a timeout, a 5xx) was not promised and is not retried."""

    def __init__(self, cluster, workers=2, pause_s=0.1):
        self.cluster = cluster
        self.pause_s = pause_s
        self.refused = 0
        self._sequence = 0
        super().__init__(list(cluster.server_urls.values()), cluster.token, workers)

    def _name(self, worker):
        with self._lock:
            self._sequence += 1
            return f"w{worker}-{self._sequence}"

    def _submit(self, urls, token, worker):
        current = worker % len(urls)
        while not self._stop.is_set():
            name = self._name(worker)
            body = {"name": name, "gpus": 1, "command": self.cluster.ledger_command()}
            try:
                status, answer, location = http_json("POST", urls[current] + "/api/v1/jobs",
                                                     body, token)
                if status in (307, 308) and location:
                    status, answer, _ = http_json("POST", location, body, token)
            except OSError:
                status, answer = None, None
            with self._lock:
                if status == 201:
                    self.acknowledged.append((answer["id"], name))
                else:
                    self.refused += 1
            if status != 201:
                current = (current + 1) % len(urls)
            time.sleep(self.pause_s)

    def snapshot(self):
        """{id: name} of every acknowledged submission so far."""
        with self._lock:
            return dict(self.acknowledged)


class NetCluster:
    def __init__(self, gpufleet):
        check(os.access(ETCD, os.X_OK), f"{ETCD} is missing (Debian package 'etcd-server')")
        check(os.path.exists(FAKETIME), f"{FAKETIME} is missing (Debian package 'libfaketime')")
        self.gpufleet = gpufleet
        self.root = tempfile.mkdtemp(prefix="gpufleet-e2e-ha-netns-")
        os.chmod(self.root, 0o755)
        self.ledger = os.path.join(self.root, "ledger")
        self.net = Network()
        self.etcd = {}  # name -> Popen
        self.servers = {}  # name -> Process
        self.agents = {}
        self.server_urls = {}
        self.clock_files = {}
        self.token = None
        for n, name in enumerate(("e1", "e2", "e3"), start=11):
            self.net.add_host(name, n)
        for n, name in enumerate(("s1", "s2", "s3"), start=21):
            self.net.add_host(name, n)
            self.server_urls[name] = f"http://{SUBNET}.{n}:8080"
        for n, name in enumerate(("a1", "a2"), start=31):
            self.net.add_host(name, n)
        self.net.add_host("client", 2)
        self.net.enter("client")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for process in [*self.agents.values(), *self.servers.values()]:
            if process.process.poll() is None:
                process.process.kill()
        for process in self.etcd.values():
            if process.poll() is None:
                process.kill()
        for name in self.agents:
            kill_recorded_workloads(os.path.join(self.root, name))
        self.net.close()
        remove_unless_failed(self.root, exc[0] is not None)
        return False

    # etcd ----------------------------------------------------------------------------------

    def etcd_client_url(self, name):
        return f"http://{self.net.address(name)}:2379"

    def start_etcd(self, name, state="new"):
        address = self.net.address(name)
        cluster = ",".join(f"{member}=http://{self.net.address(member)}:2380"
                           for member in ("e1", "e2", "e3"))
        log = open(os.path.join(self.root, f"{name}.log"), "ab")
        self.etcd[name] = subprocess.Popen(
            [*self.net.run_in(name), ETCD, "--name", name,
             "--data-dir", os.path.join(self.root, name),
             "--listen-client-urls", f"http://{address}:2379",
             "--advertise-client-urls", f"http://{address}:2379",
             "--listen-peer-urls", f"http://{address}:2380",
             "--initial-advertise-peer-urls", f"http://{address}:2380",
             "--initial-cluster", cluster, "--initial-cluster-state", state,
             "--initial-cluster-token", self.net.tag, "--logger", "zap", "--log-level", "error",
             # As docs/ha.md says to run it: without pre-vote a member that was cut off comes
             # back with a higher term and forces a second election (etcd 3.5's default).
             "--pre-vote"],
            stdout=log, stderr=log)

    def etcd_healthy(self, name):
        try:
            status, body, _ = http_json("GET", self.etcd_client_url(name) + "/health", timeout=2)
            return status == 200 and body.get("health") == "true"
        except OSError:
            return False

    def etcd_leader(self):
        """The member etcd elected, by name."""
        ids = {}
        leader = None
        for name in ("e1", "e2", "e3"):
            status, body, _ = http_json("POST", self.etcd_client_url(name) +
                                        "/v3/maintenance/status", {}, timeout=3)
            check(status == 200, f"etcd {name} status: {status} {body}")
            ids[body["header"]["member_id"]] = name
            leader = body["leader"]
        return ids[leader]

    # servers and agents --------------------------------------------------------------------

    @property
    def store(self):
        return "etcd://" + ",".join(f"{self.net.address(m)}:2379" for m in ("e1", "e2", "e3")) + \
            "/ha"

    def start_server(self, name):
        """A server whose wall clock libfaketime offsets by what its clock file says (the
        monotonic clock stays true, as with an NTP step)."""
        clock = self.clock_files.setdefault(name, os.path.join(self.root, f"{name}.clock"))
        if not os.path.exists(clock):
            with open(clock, "w") as file:
                file.write("+0\n")
        env = dict(os.environ, LD_PRELOAD=FAKETIME, FAKETIME_TIMESTAMP_FILE=clock,
                   FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
        address = self.net.address(name)
        server = Process([*self.net.run_in(name), "env", *[f"{k}={v}" for k, v in env.items()
                                                         if k.startswith(("LD_", "FAKETIME"))],
                          self.gpufleet, "server", "--data-dir", os.path.join(self.root, name),
                          "--listen", f"{address}:8080", "--store", self.store,
                          "--etcd-lease", f"{LEASE_S}s", "--node-timeout", f"{NODE_TIMEOUT_S}s",
                          "--heartbeat", f"{HEARTBEAT_S}s"],
                         os.path.join(self.root, f"{name}.log"), name)
        self.servers[name] = server
        return server

    def set_clock(self, name, offset_s):
        with open(self.clock_files[name], "w") as file:
            file.write(f"{offset_s:+d}\n")

    def role(self, name):
        """'leader' (ready), 'standby', or None when it does not answer or is failing."""
        try:
            status, body, _ = http_json("GET", self.server_urls[name] + "/readyz", timeout=2)
        except OSError:
            return None
        if status == 200:
            return "leader"
        return "standby" if body.get("role") == "standby" else None

    def leader(self, timeout=20, other_than=None):
        def find():
            for name in self.servers:
                if name != other_than and self.servers[name].process.poll() is None and \
                        self.role(name) == "leader":
                    return name
            return None
        return wait_until(find, timeout, "a leader")

    def restart_exited_servers(self):
        """What systemd's Restart= does for a server that exited (fenced, or killed)."""
        for name, server in list(self.servers.items()):
            if server.process.poll() is not None:
                self.start_server(name)

    def start_agent(self, name):
        status, body = api(self.url(), self.token, "POST", "/api/v1/tokens",
                           {"user": f"agent-{name}", "team": "system", "role": "agent"})
        check(status == 201, f"agent token: {status} {body}")
        token_file = os.path.join(self.root, f"{name}.token")
        with open(token_file, "w") as file:
            file.write(body["token"] + "\n")
        address = self.net.address(name)
        agent = Process([*self.net.run_in(name), self.gpufleet, "agent",
                         "--server", ",".join(self.server_urls.values()),
                         "--token-file", token_file, "--sim-gpus", "2xH100-80GB",
                         "--hostname", name, "--listen", f"{address}:0", "--address", address,
                         "--data-dir", os.path.join(self.root, name), "--workload-user", "agent",
                         "--workload-isolation", "none"],
                        os.path.join(self.root, f"{name}-agent.log"), f"agent {name}")
        agent.read_until(r"listening on")
        self.agents[name] = agent

    def url(self):
        return self.server_urls[self.leader()]

    def ledger_command(self):
        return ["sh", "-c", f'echo "$GPUFLEET_JOB_ID $GPUFLEET_ATTEMPT" >> {self.ledger}']

    def jobs(self):
        status, body = api(self.url(), self.token, "GET", "/api/v1/jobs?limit=10000")
        check(status == 200, f"GET jobs: {status} {body}")
        return body["jobs"]


def check_invariants(cluster, load, long_job, long_pid, fault):
    """Every acknowledged job once; each start once per attempt; the long job untouched."""
    acknowledged = load.snapshot()  # before listing: what is acknowledged later may be missing
    jobs = cluster.jobs()
    ids = [job["id"] for job in jobs]
    check(len(ids) == len(set(ids)), f"{fault}: a job id is listed twice")
    names = [job["spec"]["name"] for job in jobs]
    check(len(names) == len(set(names)), f"{fault}: a job name is listed twice")
    by_id = {job["id"]: job for job in jobs}
    lost = [job_id for job_id, name in acknowledged.items()
            if job_id not in by_id or by_id[job_id]["spec"]["name"] != name]
    check(not lost, f"{fault}: {len(lost)} acknowledged jobs lost, e.g. "
          f"{[(job_id, acknowledged[job_id], by_id.get(job_id)) for job_id in lost[:3]]}; "
          f"{len(jobs)} listed, ids up to {max(ids)}")
    with open(cluster.ledger) as file:
        starts = [line.split() for line in file if line.strip()]
    twice = {pair for pair, n in collections.Counter(map(tuple, starts)).items() if n > 1}
    check(not twice, f"{fault}: jobs started twice at one attempt: {sorted(twice)[:3]}")
    long = by_id[long_job]
    check(long["state"] == "running" and long["attempt"] == 0,
          f"{fault}: the long job is {long['state']} at attempt {long['attempt']}")
    check(os.path.exists(f"/proc/{long_pid}"), f"{fault}: the long job's process is gone")
    return len(acknowledged)


def test_faults_across_a_network(gpufleet):
    with NetCluster(gpufleet) as cluster:
        for name in ("e1", "e2", "e3"):
            cluster.start_etcd(name)
        wait_until(lambda: all(cluster.etcd_healthy(m) for m in ("e1", "e2", "e3")), 30,
                   "a healthy 3-member etcd")
        first = cluster.start_server("s1")
        first.read_until(r"listening on")
        path = os.path.join(cluster.root, "s1", "admin-token")
        first.read_until(r"admin token: created")
        wait_until(lambda: os.path.exists(path), 10, path)
        with open(path) as file:
            cluster.token = file.read().strip()
        for name in ("s2", "s3"):
            cluster.start_server(name).read_until(r"standby")
        for name in ("a1", "a2"):
            cluster.start_agent(name)
        pid_file = os.path.join(cluster.root, "long.pid")
        status, long_job = api(cluster.url(), cluster.token, "POST", "/api/v1/jobs", {
            "name": "long", "gpus": 1,
            "command": ["sh", "-c", f"{cluster.ledger_command()[2]}; echo $$ > {pid_file}; "
                        "exec sleep 600"]})
        check(status == 201, f"long job: {status} {long_job}")
        wait_until(lambda: os.path.exists(pid_file) and open(pid_file).read().strip(), 30,
                   "the long job to start")
        long_pid = int(open(pid_file).read())
        load = Load(cluster)
        results = []

        def settle(fault, started, detail=""):
            before = load.count()
            wait_until(lambda: load.count() >= before + 10, 30,
                       f"submissions to go on after: {fault}")
            total = check_invariants(cluster, load, long_job["id"], long_pid, fault)
            results.append((fault, detail, time.monotonic() - started, total))
            print(f"  {fault}: held ({detail}; {total} acknowledged so far)", flush=True)

        try:
            wait_until(lambda: load.count() >= 20, 30, "the first submissions")

            # 1. The leader dies.
            leader = cluster.leader()
            started = time.monotonic()
            cluster.servers[leader].process.kill()
            new = cluster.leader(timeout=LEASE_S + 20, other_than=leader)
            settle("leader SIGKILLed", started,
                   f"{new} led {time.monotonic() - started:.1f} s after the kill")
            cluster.restart_exited_servers()

            # 2. The leader loses etcd: it stops once it could not renew its lease for a TTL
            # (exit status 1, to come back as a standby), and a standby takes over once the
            # lease has run out in etcd.
            leader = cluster.leader()
            old = cluster.servers[leader]
            started = time.monotonic()
            cluster.net.cut_off(leader, ("e1", "e2", "e3"))
            new = cluster.leader(timeout=LEASE_S + 30, other_than=leader)
            took = time.monotonic() - started
            status = old.process.wait(LEASE_S + 10)
            stepped_down = time.monotonic() - started
            check(status == 1 and "another server may hold the lock" in old.log_tail(),
                  f"the cut-off leader: exit {status}, log {old.log_tail()}")
            cluster.net.cut_off(leader, ("e1", "e2", "e3"), heal=True)
            settle("leader cut off from etcd", started,
                   f"{leader} stopped after {stepped_down:.1f} s, {new} led after {took:.1f} s")
            cluster.restart_exited_servers()

            # 3. The leader loses the agents for less than the node timeout: their workloads run
            # on, and they sync again once healed.
            leader = cluster.leader()
            started = time.monotonic()
            cluster.net.cut_off(leader, ("a1", "a2"))
            time.sleep(NODE_TIMEOUT_S / 2)
            check(cluster.leader() == leader, "leadership moved while only agents were cut off")
            cluster.net.cut_off(leader, ("a1", "a2"), heal=True)

            def agents_ready():
                status, body = api(cluster.url(), cluster.token, "GET", "/api/v1/nodes")
                return status == 200 and all(
                    node["state"] == "ready" for node in body["nodes"]) and len(body["nodes"]) == 2
            wait_until(agents_ready, 30, "both agents syncing again")
            settle(f"leader cut off from both agents for {NODE_TIMEOUT_S / 2:g} s", started,
                   "leadership stayed; both nodes ready again")

            # 3b. The other agent, running a 2-GPU job, cut off from every server for longer
            # than the node timeout: the leader declares it lost and requeues the job (attempt
            # 1, which fits nowhere else); once healed, the agent stops attempt 0 and runs 1.
            status, long_now = api(cluster.url(), cluster.token, "GET",
                                   f"/api/v1/jobs/{long_job['id']}")
            other = next(a for a in ("a1", "a2") if a != long_now["tasks"][0]["node"])
            wide_file = os.path.join(cluster.root, "wide.pids")
            status, wide = api(cluster.url(), cluster.token, "POST", "/api/v1/jobs", {
                "name": "wide", "gpus": 2,
                "command": ["sh", "-c", f'{cluster.ledger_command()[2]}; '
                            f'echo "$GPUFLEET_ATTEMPT $$" >> {wide_file}; exec sleep 600']})
            check(status == 201, f"wide job: {status} {wide}")

            def wide_pid(attempt):
                try:
                    with open(wide_file) as file:
                        lines = [line.split() for line in file if line.strip()]
                except OSError:
                    return None
                return next((int(pid) for at, pid in lines if int(at) == attempt), None)
            asked = time.monotonic()
            first_pid = wait_until(lambda: wide_pid(0), 30, "the wide job to start")
            print(f"    the wide job started {time.monotonic() - asked:.1f} s after submission",
                  flush=True)
            servers = ("s1", "s2", "s3")
            started = time.monotonic()
            cluster.net.cut_off(other, servers)
            for server in servers:
                cluster.net.cut_off(server, (other,))

            def node_state(name):
                status, body = api(cluster.url(), cluster.token, "GET", "/api/v1/nodes")
                return next((n["state"] for n in body.get("nodes", [])
                             if n["report"]["name"] == name), None)
            wait_until(lambda: node_state(other) == "lost", NODE_TIMEOUT_S + 15,
                       f"{other} to be lost")
            lost_after = time.monotonic() - started
            status, requeued = api(cluster.url(), cluster.token, "GET", f"/api/v1/jobs/{wide['id']}")
            check(requeued["attempt"] == 1 and requeued["state"] == "pending",
                  f"the wide job once its node was lost: {requeued['state']} at attempt "
                  f"{requeued['attempt']}")
            check(os.path.exists(f"/proc/{first_pid}"),
                  "the cut-off agent stopped attempt 0 before hearing from a server")
            cluster.net.cut_off(other, servers, heal=True)
            for server in servers:
                cluster.net.cut_off(server, (other,), heal=True)
            healed = time.monotonic()
            wait_until(lambda: node_state(other) == "ready", 30, f"{other} ready again")
            ready_after = time.monotonic() - healed
            wait_until(lambda: not os.path.exists(f"/proc/{first_pid}"), 30,
                       "the agent to stop attempt 0")
            stopped_after = time.monotonic() - healed
            wait_until(lambda: wide_pid(1), 30, "attempt 1 of the wide job to start")
            restarted_after = time.monotonic() - healed
            settle(f"an agent running a 2-GPU job cut off from every server past the node timeout",
                   started, f"lost after {lost_after:.1f} s; the job requeued at attempt 1; "
                   f"once healed: ready after {ready_after:.1f} s, attempt 0 stopped after "
                   f"{stopped_after:.1f} s, attempt 1 started after {restarted_after:.1f} s")

            # 4. etcd members restart: a follower, then the elected one.
            for which in ("follower", "leader"):
                elected = cluster.etcd_leader()
                member = elected if which == "leader" else \
                    next(m for m in ("e1", "e2", "e3") if m != elected)
                started = time.monotonic()
                cluster.etcd[member].kill()
                cluster.etcd[member].wait(10)
                time.sleep(3)
                cluster.start_etcd(member, state="existing")
                wait_until(lambda: cluster.etcd_healthy(member), 30, f"etcd {member} back")
                cluster.restart_exited_servers()
                settle(f"etcd {which} member {member} SIGKILLed and restarted", started,
                       f"etcd leader now {cluster.etcd_leader()}")

            # 5. An etcd member goes silent to the servers (each member in turn, the one the
            # leader calls first among them): the lease is renewed through the others in time.
            leader = cluster.leader()
            started = time.monotonic()
            for member in ("e1", "e2", "e3"):
                cluster.net.cut_off(member, ("s1", "s2", "s3"))
                time.sleep(3)
                check(cluster.leader() == leader, f"leadership moved while {member} was silent")
                cluster.net.cut_off(member, ("s1", "s2", "s3"), heal=True)
            check(cluster.servers[leader].process.poll() is None, "the leader stopped")
            settle("each etcd member silent to the servers for 3 s in turn", started,
                   "leadership stayed")

            # 5b. A partition inside etcd's quorum: its elected member and the other two lose
            # each other (both ways) while the servers still reach all three. The two elect a
            # new leader; the cut-off member, without a quorum, answers nothing that commits,
            # and the servers' calls to it give way to the others.
            members = ("e1", "e2", "e3")
            elected = cluster.etcd_leader()
            rest = [member for member in members if member != elected]
            leader = cluster.leader()
            started = time.monotonic()
            for heal in (False, True):
                cluster.net.cut_off(elected, rest, heal=heal)
                for member in rest:
                    cluster.net.cut_off(member, [elected], heal=heal)
                if not heal:
                    time.sleep(2 * LEASE_S)
            wait_until(lambda: all(cluster.etcd_healthy(member) for member in members), 30,
                       "etcd whole again")
            kept = cluster.servers[leader].process.poll() is None and \
                cluster.leader() == leader
            cluster.restart_exited_servers()
            settle(f"etcd's elected member {elected} cut off from the other two for "
                   f"{2 * LEASE_S:g} s", started,
                   f"etcd leader now {cluster.etcd_leader()}; "
                   f"{'leadership stayed' if kept else f'{cluster.leader()} leads now'}")

            # 5c. The leader is cut off from the clients only: submissions find no leader and
            # are refused (never promised) meanwhile; the leader keeps its lease and its agents.
            leader = cluster.leader()
            started = time.monotonic()
            before = load.count()
            cluster.net.cut_off(leader, ["client"])
            time.sleep(5)
            during = load.count() - before
            cluster.net.cut_off(leader, ["client"], heal=True)
            check(cluster.leader() == leader, "leadership moved while only clients were cut off")
            wait_until(agents_ready, 30, "both agents ready")
            settle("leader cut off from the clients for 5 s", started,
                   f"leadership stayed; {during} submissions acknowledged during the cut")

            # 6. Clock steps on the leader; then a standby with a clock an hour behind takes over.
            leader = cluster.leader()
            started = time.monotonic()
            cluster.set_clock(leader, 3600)
            time.sleep(4)
            cluster.set_clock(leader, 0)
            time.sleep(4)
            check(cluster.leader() == leader, "leadership moved over a clock step")
            settle("leader's wall clock +1 h, then back", started, "leadership stayed")
            standby = next(name for name in cluster.servers if name != leader)
            cluster.set_clock(standby, -3600)
            started = time.monotonic()
            cluster.servers[leader].process.kill()
            for other in cluster.servers:
                if other not in (leader, standby):
                    cluster.servers[other].process.send_signal(signal.SIGSTOP)
            new = cluster.leader(timeout=LEASE_S + 20, other_than=leader)
            for other in cluster.servers:
                if other not in (leader, standby):
                    cluster.servers[other].process.send_signal(signal.SIGCONT)
            check(new == standby, f"{new} took over, not {standby}")
            settle("standby with a wall clock 1 h behind takes over", started,
                   f"{new} led {time.monotonic() - started:.1f} s after the kill")
        finally:
            load.stop()

        # Every acknowledged job runs to its end, each once at its attempt.
        def all_done():
            jobs = {job["id"]: job for job in cluster.jobs()}
            return all(jobs[job_id]["state"] in ("succeeded", "failed")
                       for job_id in load.snapshot())
        wait_until(all_done, 120, "every acknowledged job to finish")
        states = {job["id"]: job["state"] for job in cluster.jobs()}
        failed = [job_id for job_id in load.snapshot() if states[job_id] != "succeeded"]
        check(not failed, f"{len(failed)} acknowledged jobs failed, e.g. {failed[:3]}")
        total = check_invariants(cluster, load, long_job["id"], long_pid, "at the end")
        with open(cluster.ledger) as file:
            started_ids = {line.split()[0] for line in file if line.strip()}
        missing = [job_id for job_id in load.snapshot() if str(job_id) not in started_ids]
        check(not missing, f"{len(missing)} acknowledged jobs never started: {missing[:3]}")
        print(f"  {total} acknowledged jobs ({load.refused} submissions refused or unanswered "
              "during faults), all ran once; the long job ran through every fault untouched")


if __name__ == "__main__":
    run_tests([test_faults_across_a_network])
