#!/usr/bin/env python3
"""End to end through the real `gpufleet` binary:

- `gpufleet agent run` on 2 of 8 simulated GPUs: exit code, environment, cgroup and limits, logs
  streamed, Ctrl-C (SIGTERM with a grace period, a second Ctrl-C kills);
- the daemon on a loopback port 0: a workload launched over HTTP and cancelled, fault injection
  and status through the CLI, SIGKILL of the agent and a restart over the same data dir that
  re-adopts a running workload, SIGTERM that leaves workloads alone;
- NVML missing: a clear error, never a silent simulation.

Usage: agent_e2e_test.py PATH/TO/gpufleet
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_testlib import (Agent, TestFailure, check, die_with_parent,  # noqa: E402
                           exit_on_termination, get_json, http, kill_recorded_workloads,
                           wait_until)

# Printed by a workload: its environment and the limits of the cgroups it runs in (v1 or v2).
PROBE = r"""
import json, os
limits = {}
mounts = {}
for line in open("/proc/self/mountinfo"):
    left, right = line.split(" - ", 1)
    fstype, _, options = right.split()[:3]
    mount_point = left.split()[4]
    if fstype == "cgroup2":
        mounts["v2"] = mount_point
    elif fstype == "cgroup":
        for controller in options.split(","):
            mounts[controller] = mount_point
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.rstrip("\n").split(":", 2)
    def read(base, name):
        try:
            return open(os.path.join(base + path, name)).read().strip()
        except OSError:
            return None
    if controllers == "" and "v2" in mounts:
        memory = read(mounts["v2"], "memory.max")
        cpu = read(mounts["v2"], "cpu.max")
        if memory and path.startswith("/gpufleet/"):
            limits["memory_bytes"] = memory
            limits["cpu_quota_us"], limits["cpu_period_us"] = cpu.split()
    for controller in controllers.split(","):
        if controller == "memory" and controller in mounts:
            limits["memory_bytes"] = read(mounts["memory"], "memory.limit_in_bytes")
        if controller == "cpu" and controller in mounts:
            limits["cpu_quota_us"] = read(mounts["cpu"], "cpu.cfs_quota_us")
            limits["cpu_period_us"] = read(mounts["cpu"], "cpu.cfs_period_us")
keys = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUFLEET_GPU_UUIDS",
        "GPUFLEET_WORKLOAD_ID", "FROM_FLAG", "E2E_AGENT_ONLY"]
print(json.dumps({"env": {key: os.environ.get(key) for key in keys}, "limits": limits,
                  "cwd": os.getcwd(), "cgroup": open("/proc/self/cgroup").read()}))
"""


def run_cli(gpufleet, args, timeout=30, env=None, cwd=None):
    return subprocess.run([gpufleet, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)


def test_local_run(gpufleet, work):
    data_dir = os.path.join(work, "run")
    # The command from the issue, verbatim.
    result = run_cli(gpufleet, [
        "agent", "run", "--gpus", "2", "--sim-gpus", "8xH100-80GB", "--memory", "64Mi",
        "--cpu", "0.5", "--data-dir", data_dir, "--",
        "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup; exit 3"])
    check(result.returncode == 3, f"agent run exited {result.returncode}, not 3: {result.stderr}")
    lines = result.stdout.splitlines()
    check(re.fullmatch(r"[0-7],[0-7]", lines[0]) and len(set(lines[0].split(","))) == 2,
          f"CUDA_VISIBLE_DEVICES is not two GPU indices: {lines[0]!r}")
    limited = "NO limits" not in result.stderr
    if limited:
        check(any(re.search(r":/gpufleet/w-[0-9a-f]{12}-[0-9a-f]{8}$", line) for line in lines[1:]),
              f"the workload is not in a gpufleet cgroup:\n{result.stdout}")
    else:
        print(f"note: this machine applies no cgroup limits: {result.stderr.strip()}")
    check(re.search(r"workload w-[0-9a-f]{12} on GPUs \d,\d of 8 x NVIDIA H100 80GB HBM3 "
                    r"\(H100-80GB\) \[sim\]", result.stderr), f"no start line: {result.stderr}")
    check("exited with code 3" in result.stderr, f"no exit line: {result.stderr}")
    check(not os.listdir(os.path.join(data_dir, "workloads")),
          "the finished workload was not removed (no --keep)")

    # Environment, limits and working directory, seen from inside the workload.
    env = dict(os.environ, E2E_AGENT_ONLY="leaked")
    result = run_cli(gpufleet, [
        "agent", "run", "--gpus", "2", "--sim-gpus", "8xH100-80GB", "--memory", "64Mi",
        "--cpu", "0.5", "--env", "FROM_FLAG=yes", "--data-dir", data_dir, "--",
        sys.executable, "-c", PROBE], env=env, cwd=work)
    check(result.returncode == 0, f"probe failed ({result.returncode}): {result.stderr}")
    seen = json.loads(result.stdout)
    gpus = seen["env"]["CUDA_VISIBLE_DEVICES"]
    check(re.fullmatch(r"\d,\d", gpus), f"CUDA_VISIBLE_DEVICES {gpus!r}")
    check(seen["env"]["NVIDIA_VISIBLE_DEVICES"] == gpus, f"NVIDIA_VISIBLE_DEVICES: {seen['env']}")
    check(seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", f"CUDA_DEVICE_ORDER: {seen['env']}")
    check(len(seen["env"]["GPUFLEET_GPU_UUIDS"].split(",")) == 2, f"UUIDs: {seen['env']}")
    check(seen["env"]["FROM_FLAG"] == "yes", "--env did not reach the workload")
    check(seen["env"]["E2E_AGENT_ONLY"] is None, "the CLI's environment leaked into the workload")
    check(os.path.realpath(seen["cwd"]) == os.path.realpath(work), f"cwd {seen['cwd']}")
    if limited:
        limits = seen["limits"]
        check(limits.get("memory_bytes") == str(64 << 20), f"memory limit: {limits}")
        check(limits.get("cpu_quota_us") == "50000" and limits.get("cpu_period_us") == "100000",
              f"cpu limit: {limits}")

    # A command that cannot start: exit 127 and the reason.
    result = run_cli(gpufleet, ["agent", "run", "--sim-gpus", "2xT4", "--data-dir", data_dir,
                                "--", "/no/such/command"])
    check(result.returncode == 127, f"missing command exited {result.returncode}")
    check("No such file or directory" in result.stderr, result.stderr)
    # More GPUs than the node has: a usage error.
    result = run_cli(gpufleet, ["agent", "run", "--gpus", "3", "--sim-gpus", "2xT4",
                                "--data-dir", data_dir, "--", "true"])
    check(result.returncode == 2 and "asked for 3 GPUs; this node has 2" in result.stderr,
          f"{result.returncode}: {result.stderr}")


def read_until(stream, text, timeout):
    """Reads a line-buffered pipe until a line containing `text`; returns everything read."""
    import select
    deadline = time.monotonic() + timeout
    seen = ""
    while text not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            raise TestFailure(f"no {text!r} within {timeout} s; got {seen!r}")
        chunk = os.read(stream.fileno(), 4096).decode()
        if not chunk:
            raise TestFailure(f"output ended before {text!r}; got {seen!r}")
        seen += chunk
    return seen


def test_local_run_interrupts(gpufleet, work, processes):
    data_dir = os.path.join(work, "interrupts")
    # The first Ctrl-C sends SIGTERM; this workload traps it, cleans up and exits 7.
    process = subprocess.Popen(
        [gpufleet, "agent", "run", "--sim-gpus", "8xH100-80GB", "--gpus", "1", "--grace", "5s",
         "--data-dir", data_dir, "--", "sh", "-c",
         "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    processes.append(process)
    read_until(process.stdout, "ready", 10)
    process.send_signal(signal.SIGINT)
    code = process.wait(10)
    out, err = process.stdout.read().decode(), process.stderr.read().decode()
    check(code == 7, f"after Ctrl-C the run exited {code}, not 7: {err}")
    check("got-term" in out, f"the workload did not see SIGTERM: {out!r}")
    check("SIGINT: cancelling" in err, err)

    # A workload that ignores SIGTERM: the second Ctrl-C kills it at once (128 + 9).
    process = subprocess.Popen(
        [gpufleet, "agent", "run", "--sim-gpus", "8xH100-80GB", "--grace", "60s",
         "--data-dir", data_dir, "--", "sh", "-c",
         "trap '' TERM; echo ready; while :; do sleep 0.05; done"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    processes.append(process)
    read_until(process.stdout, "ready", 10)
    process.send_signal(signal.SIGINT)
    read_until(process.stderr, "cancelling", 10)
    process.send_signal(signal.SIGINT)
    code = process.wait(10)
    err = process.stderr.read().decode()
    check(code == 128 + 9, f"after two Ctrl-C the run exited {code}, not 137: {err}")


def test_daemon(gpufleet, work, agents):
    data_dir = os.path.join(work, "daemon")
    log = os.path.join(work, "daemon.log")
    agent = Agent(gpufleet, data_dir, log, ["--interval", "200ms"])
    agents.append(agent)
    agent.wait_ready()
    check("backend sim (SIMULATED GPUs" in agent.startup and
          "8 x NVIDIA H100 80GB HBM3 (H100-80GB)" in agent.startup and
          f"data dir {data_dir}" in agent.startup and "standalone" in agent.startup,
          f"startup line: {agent.startup}")
    health = get_json(agent.url + "/healthz")
    check(health["status"] == "ok" and health["backend"] == "sim", f"healthz: {health}")

    # Launch over HTTP, then cancel: SIGTERM.
    status, text = http("POST", agent.url + "/v1/workloads",
                        {"argv": ["sh", "-c", "echo started; exec sleep 60"], "gpus": 2,
                         "grace": "5s", "job_id": 4242})
    check(status == 201, f"launch: HTTP {status}: {text}")
    workload = json.loads(text)
    check(workload["state"] == "running" and len(workload["gpus"]) == 2, f"launched: {workload}")
    wid = workload["id"]
    wait_until(lambda: http("GET", f"{agent.url}/v1/workloads/{wid}/logs")[1] == "started\n",
               10, "the workload's output in its logs")
    gpus = get_json(agent.url + "/v1/gpus")["gpus"]
    held = [gpu["index"] for gpu in gpus if wid in gpu["workloads"]]
    check(held == workload["gpus"], f"GPUs held {held}, launched on {workload['gpus']}")
    metrics = wait_until(lambda: (lambda text: text if 'job_id="4242"' in text else None)(
        http("GET", agent.url + "/metrics")[1]), 5, "gpufleet_gpu_job for the job")
    check(len(re.findall(r'^gpufleet_gpu_job\{.*job_id="4242"\} 1$', metrics, re.M)) == 2,
          "gpufleet_gpu_job is not on exactly two GPUs")

    status, text = http("POST", f"{agent.url}/v1/workloads/{wid}/cancel", "")
    check(status == 200, f"cancel: HTTP {status}: {text}")
    ended = wait_until(
        lambda: (lambda w: w if w["state"] == "exited" else None)(
            get_json(f"{agent.url}/v1/workloads/{wid}")), 10, "the cancelled workload to end")
    check(ended["cancelled"] and ended["signal"] == 15 and ended["signal_name"] == "SIGTERM",
          f"cancelled workload: {ended}")

    # Fault injection and status through the CLI.
    result = run_cli(gpufleet, ["agent", "inject", "--agent", agent.url, "--gpu", "3", "--kind",
                                "xid", "--code", "79"])
    check(result.returncode == 0 and "UNHEALTHY: XID 79: GPU has fallen off the bus" in
          result.stdout, f"inject: {result.returncode}: {result.stdout}{result.stderr}")
    result = run_cli(gpufleet, ["agent", "inject", "--agent", agent.url, "--gpu", "3", "--kind",
                                "meltdown"])
    check(result.returncode == 2 and "unknown fault kind 'meltdown'" in result.stderr,
          f"bad inject: {result.returncode}: {result.stderr}")
    result = run_cli(gpufleet, ["agent", "status", "--agent", agent.url])
    check(result.returncode == 0 and "7 of 8 GPUs healthy" in result.stdout and
          re.search(r"\n3 .*UNHEALTHY: XID 79", result.stdout), f"status:\n{result.stdout}")

    # SIGKILL the agent: the workload lives on, and a new agent re-adopts it.
    status, text = http("POST", agent.url + "/v1/workloads",
                        {"id": "survivor", "argv": ["sleep", "60"], "gpus": 1})
    check(status == 201, f"launch survivor: HTTP {status}: {text}")
    survivor = json.loads(text)
    agent.stop(signal.SIGKILL)
    os.kill(survivor["pid"], 0)  # raises if the workload died with the agent

    agent = Agent(gpufleet, data_dir, log, ["--interval", "200ms"])
    agents.append(agent)
    agent.wait_ready()
    note = agent.read_line(5)
    while "re-adopted workload survivor" not in note:
        note = agent.read_line(5)
    check(f"(running, pid {survivor['pid']}) on GPUs {survivor['gpus'][0]}" in note, note)
    adopted = get_json(agent.url + "/v1/workloads/survivor")
    check(adopted["state"] == "running" and adopted["adopted"], f"adopted: {adopted}")
    gpu = survivor["gpus"][0]
    metrics = http("GET", agent.url + "/metrics")[1]
    check(re.search(rf'^gpufleet_gpu_job\{{gpu="{gpu}",.*job_id="survivor"\}} 1$', metrics, re.M),
          "the adopted workload's GPU is not exported as busy")
    status, text = http("POST", agent.url + "/v1/workloads", {"argv": ["true"], "gpus": [gpu]})
    check(status == 409, f"the adopted workload's GPU was handed out again: {status} {text}")

    # SIGTERM stops the agent cleanly and leaves the workload running.
    code = agent.stop(signal.SIGTERM)
    check(code == 0, f"the agent exited {code} after SIGTERM")
    os.kill(survivor["pid"], 0)
    with open(log) as file:
        check("SIGTERM received, stopping; 1 workload(s) keep running" in file.read(),
              "no stop message in the agent's log")


def test_no_silent_simulation(gpufleet, work):
    result = run_cli(gpufleet, ["agent", "--nvml-library", "/nonexistent/libnvidia-ml.so.1",
                                "--listen", "127.0.0.1:0", "--data-dir",
                                os.path.join(work, "nvml")], timeout=15)
    check(result.returncode == 1, f"exit {result.returncode}")
    check("cannot load NVML" in result.stderr and "--sim-gpus" in result.stderr, result.stderr)
    check("listening" not in result.stdout, result.stdout)
    result = run_cli(gpufleet, ["agent", "--sim-gpus", "8xNOPE", "--data-dir",
                                os.path.join(work, "nvml")])
    check(result.returncode == 2 and "unknown GPU model 'NOPE'" in result.stderr, result.stderr)


def main():
    gpufleet = os.path.abspath(sys.argv[1])
    exit_on_termination()
    work = tempfile.mkdtemp(prefix="gpufleet-agent-e2e-")
    agents, processes = [], []
    failed = False
    try:
        for name, test in [
            ("local run", lambda: test_local_run(gpufleet, work)),
            ("local run interrupts", lambda: test_local_run_interrupts(gpufleet, work, processes)),
            ("daemon", lambda: test_daemon(gpufleet, work, agents)),
            ("no silent simulation", lambda: test_no_silent_simulation(gpufleet, work)),
        ]:
            start = time.monotonic()
            try:
                test()
                print(f"ok    {name} ({time.monotonic() - start:.1f} s)")
            except (TestFailure, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as error:
                failed = True
                print(f"FAIL  {name}: {type(error).__name__}: {error}")
    finally:
        for agent in agents:
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.wait(5)
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(5)
        for data_dir in ("run", "interrupts", "daemon", "nvml"):
            kill_recorded_workloads(os.path.join(work, data_dir))
        if failed:
            log = os.path.join(work, "daemon.log")
            if os.path.exists(log):
                print("--- agent log ---\n" + open(log).read())
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
