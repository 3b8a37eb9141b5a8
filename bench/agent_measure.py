#!/usr/bin/env python3
"""Measures a running `gpufleet agent` with simulated GPUs: CPU (utime + stime from
/proc/<pid>/stat) and RSS (VmRSS, VmHWM) while it samples at its interval, then the latency of
sequential /metrics scrapes. docs/benchmarks.md ("Agent") has the figures and the command.

Usage: bench/agent_measure.py PATH/TO/gpufleet [--seconds 60] [--scrapes 1000]
                              [--sim-gpus 8xH100-80GB] [--interval 1s] [--workloads 2]
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "agent"))
from agent_testlib import die_with_parent, http as http_call, kill_recorded_workloads  # noqa: E402,E501

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime, stime


def memory_kib(pid):
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                values[key] = int(rest.split()[0])
    return values


def percentile(sorted_values, fraction):
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpufleet")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--sim-gpus", default="8xH100-80GB")
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--workloads", type=int, default=2,
                        help="sleeping workloads holding one GPU each, so every cycle also "
                             "checks on running workloads")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="gpufleet-agent-bench-")
    data_dir = os.path.join(work, "agent")
    agent = subprocess.Popen(
        [os.path.abspath(args.gpufleet), "agent", "--sim-gpus", args.sim_gpus, "--interval",
         args.interval, "--listen", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE, stderr=open(os.path.join(work, "agent.log"), "wb"),
        preexec_fn=die_with_parent)
    try:
        startup = agent.stdout.readline().decode()
        address = startup.split("listening on http://", 1)[1].split(",", 1)[0]
        host, port = address.rsplit(":", 1)
        url = f"http://{address}"
        for _ in range(args.workloads):
            status, text = http_call("POST", url + "/v1/workloads",
                                {"argv": ["sleep", str(int(args.seconds) + 600)], "gpus": 1,
                                 "grace": 0})
            assert status == 201, text
        time.sleep(3)  # past start-up: the first sample, the executor's first look at /proc

        cpu_before, wall_before = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(args.seconds)
        cpu_after, wall_after = cpu_seconds(agent.pid), time.monotonic()
        memory = memory_kib(agent.pid)
        cpu_percent = 100 * (cpu_after - cpu_before) / (wall_after - wall_before)

        # Sequential scrapes over one keep-alive connection (as Prometheus scrapes), then with a
        # new connection each time.
        results = {}
        for mode in ("keep-alive", "new connection"):
            latencies = []
            size = 0
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            for _ in range(args.scrapes):
                if mode == "new connection":
                    connection.close()
                    connection = http.client.HTTPConnection(host, int(port), timeout=10)
                start = time.perf_counter()
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                body = response.read()
                latencies.append((time.perf_counter() - start) * 1000)
                assert response.status == 200
                size = len(body)
            connection.close()
            latencies.sort()
            results[mode] = latencies
        cpu_after_scrapes = cpu_seconds(agent.pid)

        print(f"agent: {startup.strip()}")
        print(f"sampling {args.sim_gpus} every {args.interval} with {args.workloads} running "
              f"workload(s), measured over {wall_after - wall_before:.1f} s:")
        print(f"  CPU  {cpu_after - cpu_before:.2f} s = {cpu_percent:.3f} % of one core")
        print(f"  RSS  {memory['VmRSS'] / 1024:.1f} MiB (peak {memory['VmHWM'] / 1024:.1f} MiB), "
              f"{memory['Threads']} threads")
        print(f"/metrics: {size} bytes; {args.scrapes} sequential GETs each:")
        for mode, latencies in results.items():
            print(f"  {mode:15} p50 {percentile(latencies, 0.5):.3f} ms  "
                  f"p90 {percentile(latencies, 0.9):.3f} ms  "
                  f"p99 {percentile(latencies, 0.99):.3f} ms  max {latencies[-1]:.3f} ms  "
                  f"mean {statistics.fmean(latencies):.3f} ms")
        print(f"  agent CPU per scrape (both modes): "
              f"{1e6 * (cpu_after_scrapes - cpu_after) / (2 * args.scrapes):.0f} us")
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
        kill_recorded_workloads(data_dir)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
