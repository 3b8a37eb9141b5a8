#!/usr/bin/env python3
"""The control plane at 1,000 and 10,000 nodes (docs/scale.md, docs/benchmarks.md "Scale"), through
the real binaries: `gpufleet server` (SQLite) and `gpufleet agent --fleet N`, whose N simulated
nodes sync from their own loopback addresses and run tasks as timed sleeps.

Phases, each printing one line of figures:
1. register: N nodes x 8 GPUs come up; time until all are ready.
2. idle: over --idle-seconds, the syncs the server answers per second, its CPU (ms per node per
   minute) and its memory per node (RSS growth since before the fleet, over N).
3. mix: --mix-jobs jobs of the mix of issue 14 (60 % 1 GPU, 20 % 2, 10 % 4, 8 % 8, 2 % 16 as
   2 nodes x 8; each `sleep` 60-180 s), submitted as fast as --clients connections manage:
   submissions/s, time from the first submission until every one is running, submit -> running
   per job (p50/p99, stamped by the server), and the server's CPU per job over that span.
4. queued: more mix jobs until --queued wait (the cluster is full), then --probes one-GPU probe
   jobs for 8 separate probe nodes (another GPU model, so the queue cannot take them): their
   submit -> running with that many jobs queued, and the server's RSS and CPU meanwhile.

Usage: bench/fleet_measure.py PATH/TO/gpufleet [--nodes 1000] [--queued 100000] [--mix-jobs 1000]
"""

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "e2e"))
from e2e_testlib import Cluster, Process, api, wait_until  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api_measure import rss_mib  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
MIX = [(0.60, {"gpus": 1}), (0.20, {"gpus": 2}), (0.10, {"gpus": 4}), (0.08, {"gpus": 8}),
       (0.02, {"gpus": 8, "nodes": 2})]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def mix_job(rng, name="mix"):
    pick, acc = rng.random(), 0.0
    for share, shape in MIX:
        acc += share
        if pick <= acc:
            break
    return {"name": name, "command": ["sleep", str(rng.randint(60, 180))],
            "gpu_model": "H100-80GB", **shape}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


class Submitter:
    """Keep-alive connections, one per thread, each POSTing jobs."""

    def __init__(self, url, token):
        self.url, self.token = url, token
        self.local = threading.local()

    def submit(self, job):
        import http.client
        if not hasattr(self.local, "conn"):
            host, port = self.url.split("//")[1].split(":")
            self.local.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn = self.local.conn
        conn.request("POST", "/api/v1/jobs", json.dumps(job),
                     {"Authorization": f"Bearer {self.token}",
                      "Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 201:
            raise RuntimeError(f"submit: HTTP {response.status}: {body[:200]}")
        return json.loads(body)["id"]


def submit_many(submitter, jobs, clients):
    ids = []
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for job_id in pool.map(submitter.submit, jobs, chunksize=64):
            ids.append(job_id)
    return ids


def queue_counts(cluster):
    status, body = api(cluster.url, cluster.admin_token, "GET", "/api/v1/queues", timeout=60)
    assert status == 200, body
    return (sum(q["pending"] for q in body["queues"]), sum(q["running"] for q in body["queues"]))


def running_latencies(cluster, ids):
    def one(job_id):
        status, job = api(cluster.url, cluster.admin_token, "GET", f"/api/v1/jobs/{job_id}",
                          timeout=60)
        assert status == 200, job
        running = [e["time_ms"] for e in job["events"] if e["to"] == "running"]
        return running[0] - job["created_ms"] if running else None
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [v for v in pool.map(one, ids) if v is not None]


def ready_nodes(cluster, prefix):
    status, body = api(cluster.url, cluster.admin_token, "GET", "/api/v1/nodes", timeout=60)
    assert status == 200, body
    return sum(1 for n in body["nodes"]
               if n["report"]["name"].startswith(prefix) and n["state"] == "ready")


def metrics_text(cluster):
    with urllib.request.urlopen(urllib.request.Request(
            cluster.url + "/metrics", headers={"Authorization": f"Bearer {cluster.admin_token}"}),
            timeout=60) as response:
        return response.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no {name} in /metrics")


def sync_count(cluster):
    return metric(metrics_text(cluster), "gpufleet_agent_syncs_total")


def node_states(text):
    states = {}
    for line in text.splitlines():
        if line.startswith("gpufleet_nodes{state="):
            states[line.split('"')[1]] = int(float(line.split()[1]))
    return states


def watch(cluster, processes, every, stop):
    """--watch: a line every `every` s with node states, cycles and each process's CPU."""
    pids = {name: process.pid for name, process in processes.items()}
    pids["harness"] = os.getpid()
    last = {name: cpu_seconds(pid) for name, pid in pids.items()}
    last_cycles, last_t = cycles(metrics_text(cluster)), time.monotonic()
    while not stop.wait(every):
        try:
            text = metrics_text(cluster)
            now_cycles, now_t = cycles(text), time.monotonic()
            cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
            span = now_t - last_t
            usage = ", ".join(f"{name} {100 * (cpu[name] - last[name]) / span:.0f} %"
                              for name in pids)
            exited = [f"{name} exited ({process.returncode})"
                      for name, process in processes.items() if process.poll() is not None]
            if exited:
                usage += "; " + ", ".join(exited)
            print(f"  watch: nodes {node_states(text)}, "
                  f"{cycle_figures(last_cycles, now_cycles)}, CPU {usage}", flush=True)
            last, last_cycles, last_t = cpu, now_cycles, now_t
        except (OSError, RuntimeError) as error:
            print(f"  watch: {error}", flush=True)


def cycles(text):
    """(count, seconds) of the server's scheduling cycles so far, from /metrics' text."""
    return (metric(text, "gpufleet_scheduler_cycle_seconds_count"),
            metric(text, "gpufleet_scheduler_cycle_seconds_sum"))


def cycle_figures(before, after):
    count, seconds = after[0] - before[0], after[1] - before[1]
    return f"{count:.0f} cycles of {1000 * seconds / max(count, 1):.0f} ms on average"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gpufleet")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--idle-seconds", type=int, default=30)
    parser.add_argument("--mix-jobs", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=100000)
    parser.add_argument("--probes", type=int, default=50)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--watch", type=float, default=0,
                        help="print node states, cycles and CPU every this many seconds")
    args = parser.parse_args()
    gpufleet = os.path.abspath(args.gpufleet)
    rng = random.Random(args.seed)
    server_args = ["--max-connections", str(2 * args.nodes + 1000)]
    with Cluster(gpufleet, "fleet", server_args=server_args) as cluster:
        server = cluster.start_server()
        pid = server.process.pid
        time.sleep(2)
        rss_before = rss_mib(pid)
        token = cluster.token("fleet", "ops", role="agent")
        spread = max(5, args.nodes // 500)
        started = time.monotonic()
        fleet = Process([gpufleet, "agent", "--fleet", str(args.nodes), "--fleet-gpus",
                         str(args.gpus), "--server", cluster.url, "--token", token,
                         "--fleet-spread", f"{spread}s"],
                        os.path.join(cluster.root, "fleet.log"), "fleet")
        probes = Process([gpufleet, "agent", "--fleet", "8", "--fleet-gpus", "8", "--fleet-model",
                          "A100-80GB", "--fleet-prefix", "probe-", "--server", cluster.url,
                          "--token", token, "--fleet-spread", "1s"],
                         os.path.join(cluster.root, "probes.log"), "probes")
        cluster.agents.update(fleet=fleet, probes=probes)
        wait_until(lambda: ready_nodes(cluster, "fleet-") == args.nodes, 120 + 2 * spread,
                   f"{args.nodes} fleet nodes ready")
        wait_until(lambda: ready_nodes(cluster, "probe-") == 8, 60, "8 probe nodes ready")
        if args.watch > 0:
            stop_watch = threading.Event()
            threading.Thread(target=watch, daemon=True, args=(
                cluster, {"server": server.process, "fleet": fleet.process},
                args.watch, stop_watch)).start()
        print(f"register: {args.nodes} nodes x {args.gpus} GPUs ready after "
              f"{time.monotonic() - started:.1f} s (started over {spread} s)", flush=True)

        time.sleep(10)  # past the registration burst
        syncs0, cpu0, t0 = sync_count(cluster), cpu_seconds(pid), time.monotonic()
        time.sleep(args.idle_seconds)
        syncs1, cpu1, t1 = sync_count(cluster), cpu_seconds(pid), time.monotonic()
        rss = rss_mib(pid)
        span = t1 - t0
        print(f"idle: {(syncs1 - syncs0) / span:.0f} syncs/s answered, server CPU "
              f"{100 * (cpu1 - cpu0) / span:.1f} % of a core = "
              f"{1000 * 60 * (cpu1 - cpu0) / span / args.nodes:.2f} ms per node per minute, RSS "
              f"{rss:.0f} MiB ({1024 * (rss - rss_before) / args.nodes:.1f} KiB per node)",
              flush=True)

        submitter = Submitter(cluster.url, cluster.admin_token)
        jobs = [mix_job(rng) for _ in range(args.mix_jobs)]
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        ids = submit_many(submitter, jobs, args.clients)
        t_submitted = time.monotonic()
        wait_until(lambda: queue_counts(cluster)[0] == 0, 600, "every mix job placed")
        t_placed = time.monotonic()
        cpu1 = cpu_seconds(pid)
        latencies = running_latencies(cluster, ids)
        print(f"mix: {len(ids)} jobs ({sum(j.get('nodes', 1) * j['gpus'] for j in jobs)} GPUs) "
              f"submitted at {len(ids) / (t_submitted - t0):.0f}/s with {args.clients} clients, "
              f"all placed {t_placed - t0:.2f} s after the first, submit->running p50 "
              f"{statistics.median(latencies):.0f} ms p99 {percentile(latencies, 0.99):.0f} ms "
              f"({len(latencies)} running), server CPU {1000 * (cpu1 - cpu0) / len(ids):.2f} ms "
              f"per job", flush=True)

        if args.queued <= 0:
            return
        cpu0, t0, cycles0 = (cpu_seconds(pid), time.monotonic(),
                              cycles(metrics_text(cluster)))
        submitted = 0
        while True:
            pending, running = queue_counts(cluster)
            if pending >= args.queued:
                break
            batch = [mix_job(rng, "queued") for _ in range(min(10000, args.queued - pending))]
            submitted += len(submit_many(submitter, batch, args.clients))
        t_queued = time.monotonic()
        print(f"queued: {submitted} more jobs submitted at {submitted / (t_queued - t0):.0f}/s; "
              f"{pending} pending, {running} running, server RSS {rss_mib(pid):.0f} MiB, "
              f"{cycle_figures(cycles0, cycles(metrics_text(cluster)))}", flush=True)
        latencies = []
        cpu0, t0, cycles0 = (cpu_seconds(pid), time.monotonic(),
                              cycles(metrics_text(cluster)))
        for i in range(args.probes):
            job_id = submitter.submit({"name": "probe", "command": ["sleep", "1"], "gpus": 1,
                                       "priority": 1000,
                                       "gpu_model": "A100-80GB"})
            done = cluster.wait_state(job_id, ("succeeded", "failed"), timeout=120)
            running = next(e["time_ms"] for e in done["events"] if e["to"] == "running")
            latencies.append(running - done["created_ms"])
        span = time.monotonic() - t0
        text = metrics_text(cluster)
        print(f"probes with {pending} queued: submit->running p50 "
              f"{statistics.median(latencies):.0f} ms p99 {percentile(latencies, 0.99):.0f} ms "
              f"max {max(latencies)} ms over {len(latencies)}; server CPU "
              f"{100 * (cpu_seconds(pid) - cpu0) / span:.0f} % of a core, RSS "
              f"{rss_mib(pid):.0f} MiB, {cycle_figures(cycles0, cycles(text))}; "
              f"nodes {node_states(text)}", flush=True)
        fleet.stop()
        probes.stop()
        print(fleet.process.stdout.read().decode().strip().splitlines()[-1])


if __name__ == "__main__":
    main()
