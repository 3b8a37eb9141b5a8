#!/usr/bin/env python3
"""Measures the control plane through the real binaries (docs/benchmarks.md, "Control plane"):

1. submit -> running on an idle cluster: sequential one-GPU jobs on a simulated 8-GPU agent,
   from the job's creation to its `running` event (both stamped by the server);
2. durable job submissions/s with many concurrent clients (wrk, keep-alive connections, each
   request a POST /api/v1/jobs answered 201 only once committed to SQLite with fsync);
3. server RSS and restart time with N jobs stored.

Usage: bench/api_measure.py PATH/TO/gpufleet [--clients 64] [--seconds 10] [--jobs 100000]
                            [--latency-jobs 50]
       bench/api_measure.py PATH/TO/gpufleet --compare-stores [--clients 64] [--seconds 10]
           2 alone, on SQLite and on a one-member etcd (Debian's etcd-server) on loopback, in
           alternating rounds (docs/benchmarks.md, "Control plane takeover")
"""

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "e2e"))
from e2e_testlib import Cluster, api, wait_until  # noqa: E402


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stored_jobs(data_dir):
    with sqlite3.connect(f"file:{data_dir}/state.db?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM kv WHERE key >= 'jobs/' AND key < 'jobs0'"
                          ).fetchone()[0]


def run_wrk(url, token, clients, seconds):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "submit.lua")
    env = dict(os.environ, GPUFLEET_TOKEN=token)
    out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", "-s", script,
                          f"{url}/api/v1/jobs"], env=env, capture_output=True, text=True,
                         check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = float(re.search(r"latency_p50_ms ([\d.]+)", out).group(1))
    p99 = float(re.search(r"latency_p99_ms ([\d.]+)", out).group(1))
    return rate, total, int(non2xx.group(1)) if non2xx else 0, p50, p99


def compare_stores(gpufleet, args):
    from ha_e2e_test import Etcd  # noqa: E402 (tests/e2e, on the path above)
    results = {"sqlite": [], "etcd": []}
    for round_number in range(args.rounds):
        for store in ("sqlite", "etcd"):
            root = tempfile.mkdtemp(prefix="gpufleet-bench-etcd-")
            etcd = Etcd(root) if store == "etcd" else None
            server_args = ["--store", f"etcd://127.0.0.1:{etcd.client}/bench"] if etcd else []
            try:
                with Cluster(gpufleet, f"bench-{store}", server_args=server_args) as cluster:
                    cluster.start_server()
                    rate, total, non2xx, p50, p99 = run_wrk(cluster.url, cluster.admin_token,
                                                            args.clients, args.seconds)
                    results[store].append((rate, p50, p99))
                    print(f"round {round_number + 1} {store}: {rate:.0f}/s ({total} requests, "
                          f"{non2xx} not 2xx), latency p50 {p50:.1f} ms p99 {p99:.1f} ms")
            finally:
                if etcd:
                    etcd.stop()
                shutil.rmtree(root, ignore_errors=True)
    for store, runs in results.items():
        print(f"{store}: median {statistics.median(r[0] for r in runs):.0f}/s, p50 "
              f"{statistics.median(r[1] for r in runs):.1f} ms, p99 "
              f"{statistics.median(r[2] for r in runs):.1f} ms")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gpufleet")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=100000)
    parser.add_argument("--latency-jobs", type=int, default=50)
    parser.add_argument("--compare-stores", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    gpufleet = os.path.abspath(args.gpufleet)
    if args.compare_stores:
        compare_stores(gpufleet, args)
        return

    # 1. submit -> running on an idle cluster.
    with Cluster(gpufleet, "bench-latency") as cluster:
        cluster.start_server()
        cluster.start_agent("bench-node", gpus="8xH100-80GB")
        latencies = []
        for _ in range(args.latency_jobs):
            job = cluster.submit({"command": ["true"], "gpus": 1})
            done = cluster.wait_state(job["id"], ("succeeded", "failed"), timeout=30)
            running = next(e["time_ms"] for e in done["events"] if e["to"] == "running")
            latencies.append(running - done["created_ms"])
        latencies.sort()
        print(f"submit->running over {len(latencies)} jobs: p50 {statistics.median(latencies)} ms,"
              f" p95 {latencies[int(len(latencies) * 0.95) - 1]} ms, max {latencies[-1]} ms")

    # 2 and 3. Throughput, then RSS and restart with --jobs stored (no agent: they stay pending).
    with Cluster(gpufleet, "bench-submit") as cluster:
        server = cluster.start_server()
        data_dir = os.path.join(cluster.root, "server")
        rate, total, non2xx, p50, p99 = run_wrk(cluster.url, cluster.admin_token, args.clients,
                                                args.seconds)
        print(f"durable submissions: {rate:.0f}/s with {args.clients} clients over "
              f"{args.seconds} s ({total} requests, {non2xx} not 2xx, latency p50 {p50:.1f} ms "
              f"p99 {p99:.1f} ms)")
        while stored_jobs(data_dir) < args.jobs:
            run_wrk(cluster.url, cluster.admin_token, args.clients, 10)
        count = stored_jobs(data_dir)
        time.sleep(3)  # a few scheduling cycles over the whole queue
        print(f"server RSS with {count} jobs stored (pending): {rss_mib(server.process.pid):.0f} MiB")
        server.stop()
        started = time.monotonic()
        server = cluster.start_server()
        print(f"restart with {count} jobs: ready after {time.monotonic() - started:.2f} s, "
              f"RSS {rss_mib(server.process.pid):.0f} MiB")
        status, body = api(cluster.url, cluster.admin_token, "GET", "/api/v1/jobs?limit=1")
        assert status == 200, body


if __name__ == "__main__":
    main()
