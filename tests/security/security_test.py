"""Security through the real binaries on loopback: what an attacker who reaches a port can and
cannot do. Each refusal must come with the right status and leave nothing behind (no workload
started, nothing stored). docs/security.md lists what is tried here.

Usage: security_test.py path/to/gpufleet [test-name ...]"""

import json
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

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


def test_other_gpus_device_files_are_hidden(gpufleet):
    """On an NVML node with a root agent, a workload can open only its own GPUs' /dev/nvidiaN
    (named by NVML's minor numbers), and has a private /tmp and /dev/shm: the node's files there
    are out of its sight and what it writes there stays its own."""
    fake_nvml = os.environ["GPUFLEET_FAKE_NVML"]
    with Cluster(gpufleet, "devices") as cluster:
        os.chmod(cluster.root, 0o711)
        planted = os.path.join(tempfile.gettempdir(), f"gpufleet-node-file-{os.getpid()}")
        with open(planted, "w") as file:
            file.write("the node's\n")
        os.chmod(planted, 0o644)
        try:
            cluster.start_server()
            agent = cluster.start_agent(
                "node-d", gpus=None, extra_args=["--nvml-library", fake_nvml,
                                                 "--workload-user", "auto",
                                                 "--workload-isolation", "auto"],
                wrapper=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                         FAKE_DEV_SETUP, "sh"])
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


def new_id_of(cluster, secret):
    return api(cluster.url, secret, "GET", "/api/v1/whoami")[1]["id"]


TESTS = [test_agent_api_needs_the_control_planes_key, test_standalone_agent_is_loopback_only,
         test_tokens_forged_expired_revoked_rotated_and_scoped,
         test_slow_and_greedy_clients_cannot_lock_others_out,
         test_gpu_shares_carry_their_limits_to_the_workload,
         test_workloads_run_as_their_own_users, test_other_gpus_device_files_are_hidden]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
