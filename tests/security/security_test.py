"""Security through the real binaries on loopback: what an attacker who reaches a port can and
cannot do. Each refusal must come with the right status and leave nothing behind (no workload
started, nothing stored). docs/security.md lists what is tried here.

Usage: security_test.py path/to/gpufleet [test-name ...]"""

import json
import os
import pwd
import re
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection, HTTPException

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from e2e_testlib import Cluster, api, check, http, run_tests, wait_until  # noqa: E402

# Every route of the agent's API that starts, stops or reads work.
AGENT_ROUTES = [("GET", "/v1/gpus"), ("POST", "/v1/workloads"), ("GET", "/v1/workloads"),
                ("GET", "/v1/workloads/w1"), ("POST", "/v1/workloads/w1/cancel"),
                ("GET", "/v1/workloads/w1/logs"), ("POST", "/v1/sim/faults")]


def test_agent_api_needs_the_control_planes_key(gpufleet):
    """A managed agent's API refuses every caller without its key (no key, a platform token, a
    forged key), starts nothing for them and counts them; the server, which learned the key from
    the agent's syncs, still reads logs; the key is in a 0600 file on the node and nowhere in the
    server's answers."""
    with Cluster(gpufleet, "agent-auth") as cluster:
        cluster.start_server()
        agent = cluster.start_agent("node-a")
        marker = os.path.join(cluster.root, "started-by-a-stranger")
        launch = {"argv": ["touch", marker], "gpus": [0]}
        user = cluster.token("mallory", "team-m")
        refused = 0
        for credential in (None, user, cluster.admin_token, "gpa_" + "0" * 64):
            for method, path in AGENT_ROUTES:
                status, text = http(method, agent.url + path,
                                    launch if method == "POST" else None, token=credential)
                check(status == 401, f"{method} {path} with {credential!r:.12}: HTTP {status}: "
                      f"{text}")
                refused += 1
        time.sleep(1)
        check(not os.path.exists(marker), "a refused launch ran its command")

        status, text = http("GET", agent.url + "/healthz")
        check(status == 200 and json.loads(text)["api_authentication"] == "agent key",
              f"/healthz: {status} {text}")
        status, metrics = http("GET", agent.url + "/metrics")
        counted = sum(int(value) for value in re.findall(
            r'^gpufleet_agent_api_refused_total\{reason="[a-z_]+"\} (\d+)$', metrics, re.M))
        check(counted == refused, f"refusals counted {counted}, made {refused}")

        key_file = os.path.join(agent.data_dir, "api-key")
        mode = stat.S_IMODE(os.stat(key_file).st_mode)
        check(mode == 0o600, f"{key_file} has mode {oct(mode)}")
        with open(key_file) as file:
            key = file.read().strip()
        check(re.fullmatch(r"gpa_[0-9a-f]{64}", key), f"odd key {key!r}")
        status, text = http("GET", agent.url + "/v1/workloads", token=key)
        check(status == 200 and json.loads(text)["workloads"] == [], f"with the key: {text}")

        # The control plane holds the key: its log reads work, and it shows the key to no one.
        job = cluster.submit({"command": ["echo", "read through the server"], "gpus": 1})
        cluster.wait_state(job["id"], "succeeded")
        check(cluster.logs(job["id"]) == "read through the server\n", "logs through the server")
        for path in ("/api/v1/nodes", f"/api/v1/jobs/{job['id']}"):
            status, body = api(cluster.url, cluster.admin_token, "GET", path)
            check(status == 200 and key not in json.dumps(body), f"{path} shows the key")

        # On the node, `agent status` finds the key in the data dir; elsewhere it is refused.
        shown = subprocess.run([gpufleet, "agent", "status", "--agent", agent.url,
                                "--api-key-file", key_file], capture_output=True, text=True,
                               timeout=30)
        check(shown.returncode == 0 and "node-a" in shown.stdout, f"status: {shown}")
        stranger = subprocess.run([gpufleet, "agent", "status", "--agent", agent.url],
                                  capture_output=True, text=True, timeout=30,
                                  cwd=tempfile.gettempdir())
        check(stranger.returncode == 1 and "needs the agent's key" in stranger.stderr,
              f"status without the key: {stranger}")

        # A restarted agent makes a new key: the old one opens nothing, the server follows.
        agent.stop()
        agent = cluster.start_agent("node-a", token=None)
        status, _ = http("GET", agent.url + "/v1/workloads", token=key)
        check(status == 401, f"the previous key after a restart: HTTP {status}")
        job = cluster.submit({"command": ["echo", "after the restart"], "gpus": 1})
        cluster.wait_state(job["id"], "succeeded")
        wait_until(lambda: cluster.logs(job["id"]) == "after the restart\n", 10,
                   "logs through the server with the new key")


def test_standalone_agent_is_loopback_only(gpufleet):
    """A standalone agent has no credentials to check, so it refuses to listen beyond loopback,
    and says on loopback that its API is unauthenticated."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-security-") as root:
        for listen in ("0.0.0.0:0", "[::]:0", "10.0.0.1:0"):
            result = subprocess.run([gpufleet, "agent", "--standalone", "--listen", listen,
                                     "--sim-gpus", "1xH100-80GB", "--data-dir",
                                     os.path.join(root, "agent")],
                                    capture_output=True, text=True, timeout=30)
            check(result.returncode == 2 and "loopback only" in result.stderr,
                  f"--listen {listen}: exit {result.returncode}: {result.stderr!r}")
        process = subprocess.Popen([gpufleet, "agent", "--standalone", "--listen", "127.0.0.1:0",
                                    "--sim-gpus", "1xH100-80GB", "--data-dir",
                                    os.path.join(root, "agent")],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            banner = process.stdout.readline()
            check("API unauthenticated, loopback only" in banner, f"banner: {banner!r}")
        finally:
            process.terminate()
            process.wait(15)


def test_tokens_forged_expired_revoked_rotated_and_scoped(gpufleet):
    """Through the CLI and the API of a real server: forged, expired and revoked tokens get 401
    with the reason; a read-only token submits nothing; `token rotate` hands over without a
    moment when neither secret works; every refusal leaves the job list unchanged."""
    with Cluster(gpufleet, "tokens") as cluster:
        cluster.start_server()

        def jobs():
            return api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs")[1]["jobs"]

        def create(*flags):
            result = cluster.cli("token", "create", *flags)
            return result.stdout.strip(), result.stderr

        job = {"command": ["true"], "gpus": 1}
        for forged in ("gpf_" + "0" * 64, "gpf_short", cluster.admin_token[:-1] + "x",
                       "Bearer " + cluster.admin_token):
            status, body = api(cluster.url, forged, "POST", "/api/v1/jobs", job)
            check(status == 401, f"forged {forged[:12]}: HTTP {status} {body}")
        viewer, said = create("--user", "viewer", "--team", "vision", "--role", "user",
                              "--scope", "read")
        check("scope read" in said, f"create said {said!r}")
        status, body = api(cluster.url, viewer, "POST", "/api/v1/jobs", job)
        check(status == 403 and "read-only" in body.get("error", ""), f"read-only: {status} {body}")
        check(api(cluster.url, viewer, "GET", "/api/v1/jobs")[0] == 200, "read-only reads")
        brief, _ = create("--user", "brief", "--team", "vision", "--role", "user",
                          "--expires-in", "1s")
        time.sleep(1.5)
        status, body = api(cluster.url, brief, "GET", "/api/v1/whoami")
        check(status == 401 and "expired at" in body.get("error", ""), f"expired: {status} {body}")
        revoked, _ = create("--user", "gone", "--team", "vision", "--role", "user")
        gone_id = api(cluster.url, revoked, "GET", "/api/v1/whoami")[1]["id"]
        cluster.cli("token", "revoke", gone_id)
        check(api(cluster.url, revoked, "GET", "/api/v1/whoami")[0] == 401, "revoked still works")
        check(jobs() == [], f"refused calls stored jobs: {jobs()}")

        # Rotation under use: a client polling with the old secret, then the new one, never sees
        # a 401 until the overlap has passed.
        old, _ = create("--user", "ci", "--team", "vision", "--role", "user")
        old_id = api(cluster.url, old, "GET", "/api/v1/whoami")[1]["id"]
        rotated = cluster.cli("token", "rotate", old_id, "--overlap", "3s")
        new = rotated.stdout.strip()
        check(re.fullmatch(r"gpf_[0-9a-f]{64}", new) and old_id in rotated.stderr,
              f"rotate said {rotated.stdout!r} {rotated.stderr!r}")
        check(api(cluster.url, old, "GET", "/api/v1/whoami")[0] == 200, "old secret in overlap")
        check(api(cluster.url, new, "GET", "/api/v1/whoami")[1]["user"] == "ci", "new secret")
        wait_until(lambda: api(cluster.url, old, "GET", "/api/v1/whoami")[0] == 401, 10,
                   "the old secret to be refused after the overlap")
        check(api(cluster.url, new, "GET", "/api/v1/whoami")[0] == 200, "new secret after")
        listed = cluster.cli("token", "list").stdout
        check(re.search(rf"^{old_id}\s.*\s{re.escape(new_id_of(cluster, new))}\s*$", listed,
                        re.M), f"token list: {listed}")


def trickle(connection, data):
    """Sends what a refused connection (closed by the server) may no longer take."""
    try:
        connection.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def test_slow_and_greedy_clients_cannot_lock_others_out(gpufleet):
    """Slowloris from one address (hundreds of connections, each trickling a header) fills only
    that address's share of connections: the rest are answered 503 at once, and another client is
    served throughout. A user token calling in a tight loop gets 429 with Retry-After and stores
    nothing; an admin is not slowed. /metrics counts each refusal by reason."""
    per_client = 64
    with Cluster(gpufleet, "slowloris", server_args=[
            "--max-connections-per-client", str(per_client), "--token-rate-limit", "20"]) as cluster:
        cluster.start_server()
        host, port = cluster.url.removeprefix("http://").split(":")
        attackers, refused = [], 0
        try:
            for _ in range(per_client + 100):
                connection = socket.socket()
                connection.bind(("127.0.0.2", 0))
                connection.settimeout(5)
                connection.connect((host, int(port)))
                attackers.append(connection)
                trickle(connection, b"GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n")
            for connection in attackers:
                trickle(connection, b"X-Slow: 1\r\n")
            # Held connections are still waiting for their header's end; the rest were refused.
            time.sleep(0.5)  # refusals are written at accept: they are all in by now
            told = 0
            for connection in attackers:
                connection.setblocking(False)
                try:
                    answer = connection.recv(4096)
                except BlockingIOError:  # held: still waiting for its header's end
                    continue
                except ConnectionResetError:  # refused, its answer lost to the reset
                    refused += 1
                    continue
                refused += 1
                told += answer.startswith(b"HTTP/1.1 503") and \
                    b"too many connections from 127.0.0.2: 64 open" in answer
            check(refused == 100 and told > 0,
                  f"{refused} of the slowloris connections refused (not 100), {told} told why")
            status, body = api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs")
            check(status == 200, f"another client during the attack: {status} {body}")
            status, metrics = http("GET", cluster.url + "/metrics")
            check(re.search(r'^gpufleet_http_refused_total\{reason="client_connection_limit"\} '
                            r'100$', metrics, re.M), f"metrics: {metrics}")
            connections = int(re.search(r"^gpufleet_http_connections (\d+)$", metrics,
                                        re.M).group(1))
            check(connections >= per_client, f"{connections} connections open during the attack")
        finally:
            for connection in attackers:
                connection.close()

        user = cluster.token("eager", "team-e")
        job = {"command": ["true"], "gpus": 1}
        codes = [api(cluster.url, user, "GET", "/api/v1/jobs")[0] for _ in range(80)]
        check(200 in codes and 429 in codes, f"a tight loop of 80 calls got {set(codes)}")
        request = urllib.request.Request(cluster.url + "/api/v1/jobs", method="POST",
                                         data=json.dumps(job).encode(),
                                         headers={"Authorization": "Bearer " + user})
        try:
            urllib.request.urlopen(request, timeout=10)
            check(False, "a submission over the rate was accepted")
        except urllib.error.HTTPError as error:
            check(error.code == 429 and error.headers["Retry-After"] in ("1", "2"),
                  f"over the rate: {error.code} Retry-After {error.headers['Retry-After']}")
            check("rate limit of 20 requests/s" in error.read().decode(), "says why")
        for _ in range(80):
            status, _ = api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs")
            check(status == 200, f"an admin was refused: {status}")
        check(api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs")[1]["jobs"] == [],
              "a refused submission was stored")
        time.sleep(1.5)
        check(api(cluster.url, user, "GET", "/api/v1/jobs")[0] == 200, "the token works again")
        status, metrics = http("GET", cluster.url + "/metrics")
        check(re.search(r'^gpufleet_api_requests_total\{[^}]*code="429"[^}]*\} [1-9]', metrics,
                        re.M), "429s are counted in gpufleet_api_requests_total")


def test_gpu_shares_carry_their_limits_to_the_workload(gpufleet):
    """Two half-GPU jobs through the real server and agent land on one simulated GPU; each
    workload gets its MPS limits in its environment, the agent records them (its API, /metrics)
    and says they are recorded, not enforced, on simulated GPUs."""
    with Cluster(gpufleet, "shares") as cluster:
        cluster.start_server()
        agent = cluster.start_agent("node-s", gpus="1xH100-80GB")
        check("GPU shares recorded" in agent.output, f"startup line: {agent.output}")
        say = ("echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
               "$GPUFLEET_GPU_SHARING; sleep 30")
        jobs = [cluster.submit({"command": ["sh", "-c", say], "gpus": 0.5}) for _ in range(2)]
        for job in jobs:
            cluster.wait_state(job["id"], "running")
        for job in jobs:
            wait_until(lambda: cluster.logs(job["id"]) == "50 0=40779M recorded\n", 10,
                       f"job {job['id']}'s limits in its environment")
        with open(os.path.join(agent.data_dir, "api-key")) as file:
            key = file.read().strip()
        status, text = http("GET", agent.url + "/v1/workloads", token=key)
        shares = [workload.get("gpu_share") for workload in json.loads(text)["workloads"]]
        check(status == 200 and len(shares) == 2 and all(
            share == {"milli": 500, "sharing": "recorded", "compute_percent": 50,
                      "memory_limit_mib": [40779]} for share in shares), f"workloads: {text}")
        status, health = http("GET", agent.url + "/healthz")
        check(json.loads(health)["gpu_sharing"] == "recorded", f"/healthz: {health}")
        wait_until(lambda: len(re.findall(
            r'^gpufleet_gpu_share_limit\{[^}]*limit="compute_percent",sharing="recorded"\} 50$',
            http("GET", agent.url + "/metrics")[1], re.M)) == 2, 10, "both shares in /metrics")
        for job in jobs:
            cluster.cli("cancel", str(job["id"]))


def test_workloads_run_as_their_own_users(gpufleet):
    """A root agent (the default, --workload-user auto) runs each job as a uid of its own with no
    new privileges and a private TMPDIR; another job can read neither its checkpoint directory,
    nor its TMPDIR, nor its logs, nor list the agent's workloads, nor write to the data dir."""
    with Cluster(gpufleet, "users") as cluster:
        os.chmod(cluster.root, 0o711)  # passable by others, as /var/lib is
        cluster.start_server()
        agent = cluster.start_agent("node-u", extra_args=["--workload-user", "auto"])
        check("workloads run as per-job users" in agent.output, f"startup: {agent.output}")
        owner = cluster.submit({"command": ["sh", "-c",
                                            "id -u; id -g; grep NoNewPrivs /proc/self/status; "
                                            "echo secret > $GPUFLEET_CHECKPOINT_DIR/secret; "
                                            "echo secret > $TMPDIR/scratch; echo $TMPDIR; "
                                            "sleep 30"], "gpus": 1})
        lines = wait_until(lambda: (lambda text: text.split("\n") if text.count("\n") >= 4
                                    else None)(cluster.logs(owner["id"])), 15, "the owner's lines")
        uid = 200000 + owner["id"]
        check(lines[0] == str(uid) and lines[1] == str(uid), f"uid/gid: {lines}")
        check(re.fullmatch(r"NoNewPrivs:\s+1", lines[2]), f"no_new_privs: {lines[2]}")
        tmpdir = lines[3]
        workload_dir = os.path.dirname(tmpdir)
        checkpoint = os.path.join(agent.data_dir, "checkpoints", f"job-{owner['id']}")
        check(os.stat(checkpoint).st_uid == uid and
              stat.S_IMODE(os.stat(checkpoint).st_mode) == 0o700, f"{checkpoint} not its own")
        probes = [f"cat {checkpoint}/secret", f"cat {tmpdir}/scratch",
                  f"cat {workload_dir}/stdout.log", f"cat {workload_dir}/spec.json",
                  f"ls {os.path.dirname(workload_dir)}", f"touch {agent.data_dir}/planted"]
        script = "; ".join(f"{probe} >/dev/null 2>&1 && echo 'GOT {probe}' || echo refused"
                           for probe in probes)
        intruder = cluster.submit({"command": ["sh", "-c", script], "gpus": 1})
        cluster.wait_state(intruder["id"], "succeeded")
        said = wait_until(lambda: (lambda text: text if text.count("\n") >= len(probes)
                                   else None)(cluster.logs(intruder["id"])), 10, "all probes")
        check(said == "refused\n" * len(probes), f"another job got through: {said}")
        check(not os.path.exists(os.path.join(agent.data_dir, "planted")), "planted a file")
        with open(os.path.join(agent.data_dir, "api-key")) as file:
            key = file.read().strip()
        status, text = http("GET", agent.url + "/v1/workloads", token=key)
        shown = {workload["job_id"]: workload.get("run_as")
                 for workload in json.loads(text)["workloads"]}
        check(shown[owner["id"]] == {"uid": uid, "gid": uid,
                                     "name": f"uid {uid} (job {owner['id']})"}, f"{shown}")
        cluster.cli("cancel", str(owner["id"]))


# The agent's own /dev for test_other_gpus_device_files_are_hidden: the fake NVML's five GPUs as
# files "/dev/nvidiaN" (a mount hides a file as it hides a device node, and these can be read
# without a driver), and the few real nodes a shell needs. Only the agent's mount namespace sees it.
FAKE_DEV_SETUP = """set -e
dev=$(mktemp -d)
mount -t tmpfs -o mode=755 gpufleet-test-dev "$dev"
for node in null zero full random urandom tty; do cp -a /dev/$node "$dev/"; done
mkdir "$dev/shm" "$dev/pts"
ln -s /proc/self/fd "$dev/fd"
for minor in 0 1 2 3 4; do echo "gpu file $minor" > "$dev/nvidia$minor"; done
chmod 666 "$dev"/nvidia*
mount --bind "$dev" /dev
exec "$@"
"""


def start_isolating_nvml_agent(cluster, name, dev_setup):
    """A root agent on the fake NVML, with per-job users and mount namespaces, in a mount
    namespace of its own set up by `dev_setup` (a shell script that ends by exec'ing its
    arguments)."""
    return cluster.start_agent(
        name, gpus=None, extra_args=["--nvml-library", os.environ["GPUFLEET_FAKE_NVML"],
                                     "--workload-user", "auto", "--workload-isolation", "auto"],
        wrapper=["unshare", "--mount", "--propagation", "private", "sh", "-c", dev_setup, "sh"])


def test_other_gpus_device_files_are_hidden(gpufleet):
    """On an NVML node with a root agent, a workload can open only its own GPUs' /dev/nvidiaN
    (named by NVML's minor numbers), and has a private /tmp and /dev/shm: the node's files there
    are out of its sight and what it writes there stays its own."""
    with Cluster(gpufleet, "devices") as cluster:
        os.chmod(cluster.root, 0o711)
        planted = os.path.join(tempfile.gettempdir(), f"gpufleet-node-file-{os.getpid()}")
        with open(planted, "w") as file:
            file.write("the node's\n")
        os.chmod(planted, 0o644)
        try:
            cluster.start_server()
            agent = start_isolating_nvml_agent(cluster, "node-d", FAKE_DEV_SETUP)
            check("backend nvml" in agent.output and
                  "workload isolation mount namespace" in agent.output, f"{agent.output}")
            probe = ("echo $CUDA_VISIBLE_DEVICES; for minor in 0 1 2 3 4; do "
                     "cat /dev/nvidia$minor 2>/dev/null || echo \"refused $minor\"; done; "
                     f"cat {planted} 2>/dev/null || echo 'node /tmp unseen'; "
                     "echo mine > /tmp/written; echo mine > /dev/shm/written; "
                     "cat /tmp/written /dev/shm/written")
            job = cluster.submit({"command": ["sh", "-c", probe], "gpus": 2})
            cluster.wait_state(job["id"], "succeeded")
            lines = wait_until(lambda: (lambda text: text.split("\n")[:-1]
                                        if text.count("\n") >= 9 else None)(
                cluster.logs(job["id"])), 10, "the probe's lines")
            indices = [int(index) for index in lines[0].split(",")]
            check(len(indices) == 2, f"CUDA_VISIBLE_DEVICES: {lines[0]}")
            own = {(index + 1) % 5 for index in indices}  # the fixture's minor numbers
            expected = [f"gpu file {minor}" if minor in own else f"refused {minor}"
                        for minor in range(5)]
            check(lines[1:6] == expected, f"device files: {lines[1:6]}, expected {expected}")
            check(lines[6:] == ["node /tmp unseen", "mine", "mine"], f"tmp: {lines[6:]}")
            check(not os.path.exists("/tmp/written") and not os.path.exists("/dev/shm/written"),
                  "the workload wrote into the node's /tmp or /dev/shm")
            status, text = http("GET", agent.url + "/healthz")
            check("other GPUs' device files hidden" in json.loads(text)["workload_isolation"],
                  f"/healthz: {text}")
        finally:
            os.unlink(planted)


# test_mig_instances_are_devices_of_their_own: the fake NVML puts GPU 3 (minor 4) in MIG mode
# with a 3g.40gb (GPU instance 1) and a 1g.10gb (GPU instance 9); the driver's capability files
# for them, and its table of their minors, which the agent reads from /proc/driver.
MIG_DEV_SETUP = FAKE_DEV_SETUP.replace('mount --bind "$dev" /dev', """mkdir "$dev/nvidia-caps"
for cap in 30 31 66 67; do echo "cap $cap" > "$dev/nvidia-caps/nvidia-cap$cap"; done
chmod 666 "$dev"/nvidia-caps/*
driver=$(mktemp -d)
mkdir "$driver/nvidia-caps"
printf '%s\\n' 'config 1' 'monitor 2' 'gpu4/gi1/access 30' 'gpu4/gi1/ci0/access 31' \\
    'gpu4/gi9/access 66' 'gpu4/gi9/ci0/access 67' > "$driver/nvidia-caps/mig-minors"
mount --bind "$driver" /proc/driver
export GPUFLEET_FAKE_NVML_MIG_GPU=3
mount --bind "$dev" /dev""")


def test_mig_instances_are_devices_of_their_own(gpufleet):
    """A GPU in MIG mode is offered as its MIG instances: the server sees them as GPUs of their
    own model ("H100-80GB-MIG-1g.10gb"), a job that asks for that model gets one instance by its
    MIG UUID in CUDA_VISIBLE_DEVICES, and it can open its GPU's node and its own instance's
    capability files but not the other instance's, nor any other GPU."""
    with Cluster(gpufleet, "mig") as cluster:
        os.chmod(cluster.root, 0o711)
        cluster.start_server()
        agent = start_isolating_nvml_agent(cluster, "node-g", MIG_DEV_SETUP)
        check("cannot be kept from opening" not in agent.output, f"startup: {agent.output}")
        gpus = next(node for node in cluster.nodes()
                    if node["report"]["name"] == "node-g")["report"]["gpus"]
        models = sorted(gpu["model"] for gpu in gpus)
        check(models == ["H100-80GB", "H100-80GB", "H100-80GB", "H100-80GB-MIG-1g.10gb",
                         "H100-80GB-MIG-3g.40gb", "L40S"], f"the server sees {models}")
        probe = ("echo $CUDA_VISIBLE_DEVICES; for file in nvidia0 nvidia1 nvidia2 nvidia3 "
                 "nvidia4 nvidia-caps/nvidia-cap30 nvidia-caps/nvidia-cap31 "
                 "nvidia-caps/nvidia-cap66 nvidia-caps/nvidia-cap67; do "
                 "cat /dev/$file 2>/dev/null || echo \"refused $file\"; done")
        job = cluster.submit({"command": ["sh", "-c", probe], "gpus": 1,
                              "gpu_model": ["H100-80GB-MIG-1g.10gb"]})
        cluster.wait_state(job["id"], "succeeded")
        lines = wait_until(lambda: (lambda text: text.split("\n")[:-1]
                                    if text.count("\n") >= 10 else None)(
            cluster.logs(job["id"])), 10, "the probe's lines")
        check(lines[0] == "MIG-11111111-2222-3333-4444-000000000002",
              f"CUDA_VISIBLE_DEVICES: {lines[0]}")
        check(lines[1:] == ["refused nvidia0", "refused nvidia1", "refused nvidia2",
                            "refused nvidia3", "gpu file 4",
                            "refused nvidia-caps/nvidia-cap30",
                            "refused nvidia-caps/nvidia-cap31", "cap 66", "cap 67"],
              f"device files: {lines[1:]}")
        status, text = http("GET", agent.url + "/metrics")
        check('GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"' in text, "MIG labels in the metrics")


def test_platform_users_run_as_their_unix_accounts(gpufleet):
    """`--workload-user mapped`: a job runs as the node's Unix account named like the platform
    user who submitted it, with its groups and no new privileges. A platform user with no account
    there, and one whose account is root, are refused at launch with the reason, and nothing of
    theirs runs."""
    with Cluster(gpufleet, "mapped") as cluster:
        os.chmod(cluster.root, 0o711)  # passable by others, as /var/lib is
        cluster.start_server()
        agent = cluster.start_agent("node-m", extra_args=["--workload-user", "mapped"])
        check("named like the jobs' platform users" in agent.output, f"startup: {agent.output}")
        nobody = pwd.getpwnam("nobody")
        job = cluster.submit({"command": ["sh", "-c", "id -u; id -g; id -un; grep NoNewPrivs "
                                          "/proc/self/status; test -O \"$TMPDIR\" && echo own"],
                              "gpus": 1}, token=cluster.token("nobody", "ops"))
        cluster.wait_state(job["id"], "succeeded")
        lines = cluster.logs(job["id"]).split("\n")
        check(lines[:3] == [str(nobody.pw_uid), str(nobody.pw_gid), "nobody"], f"id: {lines}")
        check(re.fullmatch(r"NoNewPrivs:\s+1", lines[3]) and lines[4] == "own", f"{lines}")
        for user, why in (("root", "platform user 'root' maps to uid 0 (root)"),
                          ("no-such-account-q", "'no-such-account-q' has no Unix account on "
                                                "node-m")):
            marker = os.path.join(cluster.root, f"ran-as-{user}")
            job = cluster.submit({"command": ["touch", marker], "gpus": 1},
                                 token=cluster.token(user, "ops"))
            failed = cluster.wait_state(job["id"], "failed")
            check(why in json.dumps(failed), f"job of {user}: {failed}")
            check(not os.path.exists(marker), f"{user}'s command ran")


SERVER_SOURCES = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src",
                               "server", name) for name in ("server_api.cpp", "deployments.cpp")]


def api_routes():
    """Every /api/v1 route the server registers, read from its sources, so that a route added
    without a team-isolation case here fails the test below."""
    routes = set()
    for path in SERVER_SOURCES:
        with open(path) as file:
            routes |= set(re.findall(r'(?:api\(|\{)"(GET|POST|DELETE)", "(/api/v1/[^"]*)"',
                                     file.read()))
    check(len(routes) >= 20, f"found only {len(routes)} routes in {SERVER_SOURCES}")
    return routes


def test_teams_see_and_touch_only_their_own(gpufleet):
    """Bob (team speech) has a running job with a secret in its env and its output, a finished
    job, a deployment at zero replicas and a queue for his team. Alice (team vision) calls every
    /api/v1 route and the gateway's routes against them: each answers 404 (as if they did not
    exist), 403 or 409, or shows only vision's own; nothing of bob's is in any answer, nothing is
    stored, bob's deployment is not scaled up by her requests and his job keeps running."""
    queues = os.path.join(tempfile.mkdtemp(prefix="gpufleet-security-"), "queues.yaml")
    with open(queues, "w") as file:
        file.write("- {name: speech, guaranteed_gpus: 2, teams: [speech]}\n"
                   "- {name: default, guaranteed_gpus: 2}\n")
    with Cluster(gpufleet, "teams", server_args=["--queues", queues]) as cluster:
        cluster.start_server()
        cluster.start_agent("node-t")
        bob, alice = cluster.token("bob", "speech"), cluster.token("alice", "vision")
        secret = "speech-secret-7f3a"
        running = cluster.submit({"command": ["sh", "-c", f"echo {secret}-out; sleep 120"],
                                  "gpus": 1, "queue": "speech", "name": "asr-train",
                                  "env": {"BOB_SECRET": secret}}, token=bob)
        finished = cluster.submit({"command": ["echo", f"{secret}-done"], "gpus": 1}, token=bob)
        cluster.wait_state(running["id"], "running")
        cluster.wait_state(finished["id"], "succeeded")
        wait_until(lambda: secret in cluster.logs(running["id"], token=bob), 10, "bob's output")
        status, body = api(cluster.url, bob, "POST", "/api/v1/deployments", {
            "name": "speech-asr", "command": ["sh", "-c", f"echo {secret}; sleep 100"],
            "gpus": 1, "min_replicas": 0, "max_replicas": 1, "queue": "speech",
            "models": ["speech-asr-v1"]})
        check(status == 201, f"bob's deployment: HTTP {status}: {body}")
        mine = cluster.submit({"command": ["echo", "vision's own"], "gpus": 1}, token=alice)
        cluster.wait_state(mine["id"], "succeeded")
        bob_token_id = new_id_of(cluster, bob)

        gateway = cluster.start_gateway()
        gateway_url = gateway.url

        def admin_view():
            jobs = api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs")[1]["jobs"]
            deployments = api(cluster.url, cluster.admin_token, "GET",
                              "/api/v1/deployments")[1]["deployments"]
            audit = api(cluster.url, cluster.admin_token, "GET", "/api/v1/audit")[1]
            tokens = api(cluster.url, cluster.admin_token, "GET", "/api/v1/tokens")[1]
            return ([(job["id"], job["state"], job["attempt"]) for job in jobs],
                    [(d["name"], d["spec"], d["desired_replicas"]) for d in deployments],
                    len(audit["entries"]), tokens)

        before = admin_view()
        job_id, name = running["id"], "speech-asr"
        spec = {"command": ["true"], "gpus": 1}
        # (method, route pattern, path, body, the statuses allowed, must the answer list only
        # vision's things)
        cases = [
            ("POST", "/api/v1/jobs", "/api/v1/jobs", dict(spec, queue="speech"), {403}),
            ("GET", "/api/v1/jobs", "/api/v1/jobs", None, {200}),
            ("GET", "/api/v1/jobs", "/api/v1/jobs?state=running", None, {200}),
            ("GET", "/api/v1/jobs/{id}", f"/api/v1/jobs/{job_id}", None, {404}),
            ("GET", "/api/v1/jobs/{id}", f"/api/v1/jobs/{finished['id']}", None, {404}),
            ("POST", "/api/v1/jobs/{id}/cancel", f"/api/v1/jobs/{job_id}/cancel", {}, {404}),
            ("GET", "/api/v1/jobs/{id}/logs", f"/api/v1/jobs/{job_id}/logs", None, {404}),
            ("GET", "/api/v1/jobs/{id}/logs",
             f"/api/v1/jobs/{finished['id']}/logs?stream=stdout&offset=0", None, {404}),
            ("GET", "/api/v1/nodes", "/api/v1/nodes", None, {200}),
            ("POST", "/api/v1/nodes/{name}/drain", "/api/v1/nodes/node-t/drain", {}, {403}),
            ("POST", "/api/v1/nodes/{name}/undrain", "/api/v1/nodes/node-t/undrain", {}, {403}),
            ("GET", "/api/v1/queues", "/api/v1/queues", None, {200}),
            ("GET", "/api/v1/usage", "/api/v1/usage", None, {200}),
            ("GET", "/api/v1/usage", "/api/v1/usage?by=user", None, {200}),
            ("GET", "/api/v1/whoami", "/api/v1/whoami", None, {200}),
            ("POST", "/api/v1/tokens", "/api/v1/tokens",
             {"user": "bob", "team": "speech", "role": "user"}, {403}),
            ("GET", "/api/v1/tokens", "/api/v1/tokens", None, {403}),
            ("DELETE", "/api/v1/tokens/{id}", f"/api/v1/tokens/{bob_token_id}", None, {403}),
            ("POST", "/api/v1/tokens/{id}/rotate", f"/api/v1/tokens/{bob_token_id}/rotate", {},
             {403}),
            ("GET", "/api/v1/audit", "/api/v1/audit", None, {403}),
            ("POST", "/api/v1/agents/sync", "/api/v1/agents/sync", {"node": {"name": "node-t"}},
             {403}),
            ("POST", "/api/v1/deployments", "/api/v1/deployments",
             {"name": name, "command": ["true"], "gpus": 1, "max_replicas": 1}, {409}),
            ("POST", "/api/v1/deployments", "/api/v1/deployments",
             {"name": "into-speech", "command": ["true"], "gpus": 1, "max_replicas": 1,
              "queue": "speech"}, {403}),
            ("GET", "/api/v1/deployments", "/api/v1/deployments", None, {200}),
            ("GET", "/api/v1/deployments/{name}", f"/api/v1/deployments/{name}", None, {404}),
            ("POST", "/api/v1/deployments/{name}/scale", f"/api/v1/deployments/{name}/scale",
             {"replicas": 1}, {404}),
            ("DELETE", "/api/v1/deployments/{name}", f"/api/v1/deployments/{name}", None, {404}),
            ("GET", "/api/v1/endpoints", "/api/v1/endpoints", None, {200}),
            ("POST", "/api/v1/gateways/report", "/api/v1/gateways/report",
             {"gateway": "gw-forged", "deployments": [{"name": name, "buffered": 5}]}, {403}),
        ]
        leaks = [secret, "bob", "speech-asr", "asr-train", bob]
        for method, _, path, body, allowed in cases:
            status, text = http(method, cluster.url + path, body, token=alice)
            check(status in allowed, f"alice {method} {path}: HTTP {status} (wanted "
                  f"{sorted(allowed)}): {text}")
            # A 403 for the speech queue names the queue's team: that is the refusal's point.
            shown = text.replace("team(s) speech", "") if status == 403 else text
            # What she named herself (a path, a deployment name) may come back in the answer.
            asked = path + json.dumps(body)
            found = [leak for leak in leaks if leak in shown and leak not in asked]
            check(not found, f"alice {method} {path} shows {found}: {text}")
            if status == 200 and "/jobs" in path:
                check([job["id"] for job in json.loads(text)["jobs"]] in ([mine["id"]], []),
                      f"alice's job list: {text}")
        covered = {(method, pattern) for method, pattern, *_ in cases}
        missing = api_routes() - covered
        check(not missing, f"routes without a team-isolation case: {sorted(missing)}")

        # Through the gateway: bob's model and path prefix do not exist for her, and her
        # requests buffer nothing, so bob's deployment stays at zero.
        for method, path, body in [
                ("GET", "/v1/models", None),
                ("POST", "/v1/completions", {"model": "speech-asr-v1", "prompt": "x"}),
                ("POST", "/v1/chat/completions",
                 {"model": "speech-asr-v1", "messages": [{"role": "user", "content": "x"}]}),
                ("GET", f"/d/{name}/", None)]:
            status, text = http(method, gateway_url + path, body, token=alice)
            check((status == 200) == (path == "/v1/models") and status in (200, 404),
                  f"gateway {method} {path}: HTTP {status}: {text}")
            asked = path + json.dumps(body)
            check(not any(leak in text and leak not in asked for leak in leaks),
                  f"gateway {path} shows: {text}")
        status, text = http("GET", gateway_url + "/metrics", token=alice)
        check(status == 403, f"gateway /metrics for alice: HTTP {status}")

        # The CLI says the same.
        for verb in (["logs", str(job_id)], ["cancel", str(job_id)], ["deployment", "show", name],
                     ["scale", name, "1"], ["delete", name]):
            result = cluster.cli(*verb, token=alice, check_code=None)
            said = result.stdout + result.stderr
            check(result.returncode != 0 and not any(leak in said for leak in leaks[:1]),
                  f"gpufleet {' '.join(verb)} as alice: {result}")

        time.sleep(2.5)  # past an autoscaler tick: a buffered request would have scaled it
        after = admin_view()
        check(after == before, f"the store changed:\nbefore {before}\nafter  {after}")
        check(cluster.job(job_id)["state"] == "running", "bob's job was touched")
        status, body = api(cluster.url, bob, "GET", f"/api/v1/deployments/{name}")
        check(status == 200 and body["desired_replicas"] == 0 and body["replicas"] == [],
              f"bob's deployment after alice's requests: {body}")
        gateway.stop()


def raw_request(base, method, path, body=b"", token=None, headers=None, timeout=30):
    """(status, text) of one request sent as given: any bytes in the body, the path unnormalised."""
    host, port = base.removeprefix("http://").split(":")
    connection = HTTPConnection(host, int(port), timeout=timeout)
    try:
        sent = dict(headers or {})
        if token:
            sent["Authorization"] = "Bearer " + token
        if body or method in ("POST", "PUT"):
            sent["Content-Type"] = "application/json"
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    except (OSError, HTTPException) as error:
        return 0, f"connection error: {error}"
    finally:
        connection.close()


BAD_IDS = ["-1", "abc", "99999999999999999999999", "..%2F..%2Fetc%2Fpasswd", "%00", "a" * 5000,
           "%C3%BC"]
BAD_BODIES = [b"", b"null", b"[]", b"{", b'{"a": ' * 40 + b"1" + b"}" * 40, b'{"bogus": 1}',
              b'{"command": ["\xff\xfe"]}', b"x" * (2 << 20)]


def bad_input_cases(job_id, deployment, token_id):
    """(route method, route pattern, path, body, token kind) for every /api/v1 route: bad path
    parameters, bad query values, malformed or wrong bodies, a query that does not decode."""
    cases = []

    def add(method, pattern, paths=None, bodies=(b"",), token="admin"):
        for path in paths or [pattern]:
            for body in bodies:
                cases.append((method, pattern, path, body, token))

    def with_ids(pattern, param, ids=BAD_IDS):
        return [pattern.replace("{" + param + "}", value) for value in ids]

    job = {"command": ["true"], "gpus": 1}
    add("POST", "/api/v1/jobs", bodies=BAD_BODIES + [json.dumps(dict(job, **change)).encode()
                                                      for change in (
        {"command": "not a list"}, {"gpus": -1}, {"gpus": "many"}, {"tasks": 0},
        {"tasks": 1000000}, {"priority": 1e99999}, {"env": {f"V{i}": "x" for i in range(2000)}},
        {"env": {"": "x"}}, {"workdir": "w" * 40000}, {"max_runtime": "forever"})])
    add("GET", "/api/v1/jobs", [f"/api/v1/jobs?{query}" for query in
                                ("limit=-1", "limit=abc", "limit=99999999999", "state=bogus")])
    add("GET", "/api/v1/jobs/{id}", with_ids("/api/v1/jobs/{id}", "id"))
    add("POST", "/api/v1/jobs/{id}/cancel", with_ids("/api/v1/jobs/{id}/cancel", "id"))
    add("GET", "/api/v1/jobs/{id}/logs", with_ids("/api/v1/jobs/{id}/logs", "id") +
        [f"/api/v1/jobs/{job_id}/logs?{query}" for query in
         ("task=-1", "task=99", "task=abc", "stream=..%2F..%2F..%2Fetc%2Fpasswd", "stream=stdin",
          "offset=-5", "offset=abc", "offset=99999999999999999999999")])
    add("POST", "/api/v1/nodes/{name}/drain",
        with_ids("/api/v1/nodes/{name}/drain", "name", BAD_IDS + ["no-such-node"]))
    add("POST", "/api/v1/nodes/{name}/undrain",
        with_ids("/api/v1/nodes/{name}/undrain", "name", BAD_IDS + ["no-such-node"]))
    add("GET", "/api/v1/usage", [f"/api/v1/usage?{query}" for query in
                                 ("since_ms=-1", "since_ms=abc", "since_ms=5&until_ms=5",
                                  "by=bogus")])
    add("POST", "/api/v1/tokens", bodies=BAD_BODIES + [json.dumps(body).encode() for body in (
        {"user": "", "team": "t"}, {"user": "u", "role": "root"}, {"user": "u", "scope": "all"},
        {"user": "u", "expires_in": "-5s"}, {"user": "u", "expires_in": "forever"},
        {"user": "u" * 300})])
    add("DELETE", "/api/v1/tokens/{id}",
        with_ids("/api/v1/tokens/{id}", "id", BAD_IDS + ["tok-00000000"]))
    add("POST", "/api/v1/tokens/{id}/rotate",
        with_ids("/api/v1/tokens/{id}/rotate", "id", BAD_IDS + ["tok-00000000"]))
    add("POST", "/api/v1/tokens/{id}/rotate", [f"/api/v1/tokens/{token_id}/rotate"],
        bodies=[body for body in BAD_BODIES if body] + [json.dumps(body).encode() for body in (
            {"overlap": "-1s"}, {"overlap": "forever"}, {"overlap": -5})])
    add("GET", "/api/v1/audit", [f"/api/v1/audit?limit={value}" for value in ("-1", "abc", "0")])
    add("POST", "/api/v1/agents/sync", bodies=BAD_BODIES + [json.dumps(body).encode() for body in (
        {"node": 5}, {"node": {"name": "../x"}}, {"node": {"name": ""}},
        {"node": {"name": "n"}, "agent_key": "k" * 300}, {"node": {"name": "n"}, "workloads": 7})])
    add("POST", "/api/v1/deployments", bodies=BAD_BODIES + [json.dumps(body).encode() for body in (
        {"name": "../x", "command": ["true"]}, {"name": "", "command": ["true"]},
        {"name": "d", "command": ["true"], "min_replicas": -1},
        {"name": "d", "command": ["true"], "max_replicas": 100000},
        {"name": "d", "command": "true"}, {"name": "d", "command": ["true"], "gpus": -1})])
    add("GET", "/api/v1/deployments/{name}",
        with_ids("/api/v1/deployments/{name}", "name", BAD_IDS + ["no-such"]))
    add("POST", "/api/v1/deployments/{name}/scale",
        with_ids("/api/v1/deployments/{name}/scale", "name", BAD_IDS + ["no-such"]),
        bodies=[b'{"replicas": 1}'])
    add("POST", "/api/v1/deployments/{name}/scale", [f"/api/v1/deployments/{deployment}/scale"],
        bodies=BAD_BODIES + [json.dumps(body).encode() for body in (
            {"replicas": -1}, {"replicas": 5000}, {"replicas": "one"}, {"min_replicas": 3,
                                                                       "max_replicas": 1})])
    add("DELETE", "/api/v1/deployments/{name}",
        with_ids("/api/v1/deployments/{name}", "name", BAD_IDS + ["no-such"]))
    add("GET", "/api/v1/endpoints", [f"/api/v1/endpoints?{query}" for query in
                                     ("version=-1", "version=12abc", "wait_ms=-1",
                                      "wait_ms=99999999999")], token="gateway")
    add("POST", "/api/v1/gateways/report", token="gateway",
        bodies=BAD_BODIES + [json.dumps(body).encode() for body in (
            {"gateway": 5}, {"gateway": "g", "deployments": 7},
            {"gateway": "g", "deployments": [{"name": 5}]})])
    # Every route: a query that does not percent-decode.
    for method, pattern in sorted(api_routes()):
        path = pattern.replace("{id}", "1").replace("{name}", "x") + "?q=%zz"
        add(method, pattern, [path], token="gateway" if "gateway" in pattern or
            "endpoints" in pattern else "admin")
    return cases


def test_malformed_input_on_every_route_is_refused_and_stores_nothing(gpufleet):
    """Bad path parameters (negative, huge, non-numeric, `../` and NUL, 5,000 characters), bad
    query values, malformed, deep, oversized and wrong bodies on every /api/v1 route, with an
    admin's token so that nothing but the input can be the reason: each gets a 4xx that says why,
    never a 5xx or a 2xx; /etc/passwd never comes back; and the store is the same afterwards. A
    job that names its own GPUFLEET_CHECKPOINT_DIR gets the agent's, and the directory it named
    is left as it was."""
    with Cluster(gpufleet, "bad-input") as cluster:
        cluster.start_server()
        cluster.start_agent("node-b")
        job = cluster.submit({"command": ["sh", "-c", "echo $GPUFLEET_CHECKPOINT_DIR"],
                              "gpus": 1, "env": {"GPUFLEET_CHECKPOINT_DIR": "/etc"}})
        cluster.wait_state(job["id"], "succeeded")
        checkpoint = wait_until(lambda: cluster.logs(job["id"]).strip(), 10, "the job's line")
        check(checkpoint != "/etc" and checkpoint.startswith(cluster.root),
              f"the job's checkpoint dir: {checkpoint}")
        check(os.stat("/etc").st_uid == 0 and stat.S_IMODE(os.stat("/etc").st_mode) == 0o755,
              "/etc was changed")
        status, body = api(cluster.url, cluster.admin_token, "POST", "/api/v1/deployments", {
            "name": "steady", "command": ["sleep", "100"], "gpus": 1, "min_replicas": 0,
            "max_replicas": 2})
        check(status == 201, f"deployment: {status} {body}")
        gateway_token = cluster.token("gw-b", "", "gateway")
        token_id = new_id_of(cluster, gateway_token)

        def store():
            view = [api(cluster.url, cluster.admin_token, "GET", path)[1] for path in
                    ("/api/v1/jobs", "/api/v1/deployments", "/api/v1/tokens", "/api/v1/nodes")]
            for node in view[3]["nodes"]:  # what the agent's syncs change by themselves
                node.pop("last_seen_ms", None)
                node["report"].pop("gpus", None)
            audit = api(cluster.url, cluster.admin_token, "GET", "/api/v1/audit")[1]
            return view, len(audit["entries"])

        before = store()
        tokens = {"admin": cluster.admin_token, "gateway": gateway_token}
        per_route = {}
        for method, pattern, path, body, token in bad_input_cases(job["id"], "steady", token_id):
            status, text = raw_request(cluster.url, method, path, body, tokens[token])
            per_route[(method, pattern)] = per_route.get((method, pattern), 0) + 1
            shown = f"{method} {path[:80]} {body[:60]!r}: HTTP {status}: {text[:200]}"
            check(400 <= status < 500, shown)
            check("error" in text and "root:x:0:0" not in text, shown)
        missing = api_routes() - set(per_route)
        check(not missing, f"routes without bad-input cases: {sorted(missing)}")
        # An oversized header, on the layer below every route.
        status, _ = raw_request(cluster.url, "GET", "/api/v1/jobs", token=cluster.admin_token,
                                headers={"X-Padding": "p" * (20 << 10)})
        check(status == 431, f"a 20 KiB header: HTTP {status}")
        check(store() == before, "the store changed")
        total = sum(per_route.values())
        print(f"{total} bad inputs on {len(per_route)} routes:")
        for (method, pattern), count in sorted(per_route.items(), key=lambda item: item[0][1]):
            print(f"  {count:3} {method} {pattern}")


def new_id_of(cluster, secret):
    return api(cluster.url, secret, "GET", "/api/v1/whoami")[1]["id"]


TESTS = [test_agent_api_needs_the_control_planes_key, test_standalone_agent_is_loopback_only,
         test_tokens_forged_expired_revoked_rotated_and_scoped,
         test_slow_and_greedy_clients_cannot_lock_others_out,
         test_gpu_shares_carry_their_limits_to_the_workload,
         test_workloads_run_as_their_own_users, test_other_gpus_device_files_are_hidden,
         test_mig_instances_are_devices_of_their_own,
         test_platform_users_run_as_their_unix_accounts, test_teams_see_and_touch_only_their_own,
         test_malformed_input_on_every_route_is_refused_and_stores_nothing]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
