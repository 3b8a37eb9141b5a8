#!/usr/bin/env python3
"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a real `gpufleet agent
--sim-gpus 8xH100-80GB` on loopback every second; the values are read back through Prometheus'
HTTP API and compared with the agent's own /metrics. Then an XID is injected and the GPU's
gpufleet_gpu_healthy is read back as 0 through Prometheus.

Usage: prometheus_test.py PATH/TO/gpufleet [PATH/TO/prometheus]
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_testlib import (Agent, TestFailure, check, exit_on_termination,  # noqa: E402
                           http, kill_recorded_workloads, start_prometheus, wait_until)

DEADLINE_S = 30  # every wait on Prometheus, together, stays within this


def query(prometheus_url, expression):
    status, text = http("GET", prometheus_url + "/api/v1/query?" +
                        urllib.parse.urlencode({"query": expression}), timeout=5)
    check(status == 200, f"query {expression}: HTTP {status}: {text}")
    answer = json.loads(text)
    check(answer["status"] == "success", f"query {expression}: {answer}")
    return answer["data"]["result"]


def agent_values(agent_url, name):
    """{gpu index: value} of one family in the agent's own /metrics."""
    values = {}
    for line in http("GET", agent_url + "/metrics")[1].splitlines():
        match = re.match(name + r'\{gpu="(\d+)",.*\} (\S+)$', line)
        if match:
            values[int(match.group(1))] = float(match.group(2))
    return values


def main():
    gpufleet = os.path.abspath(sys.argv[1])
    prometheus = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/prometheus"
    if not os.access(prometheus, os.X_OK):
        print(f"FAIL: {prometheus} is missing: this test needs the Prometheus server "
              "(Debian package 'prometheus'; `make deps` installs it)")
        return 1

    exit_on_termination()
    work = tempfile.mkdtemp(prefix="gpufleet-prometheus-")
    data_dir = os.path.join(work, "agent")
    agents = []
    server = None
    failed = False
    try:
        agent = Agent(gpufleet, data_dir, os.path.join(work, "agent.log"))
        agents.append(agent)
        agent.wait_ready()
        agent_address = agent.url.removeprefix("http://")

        server, prometheus_url, prometheus_log = start_prometheus(
            prometheus, work, "gpufleet-agent", agent_address)
        start = time.monotonic()

        def left():
            return max(1.0, DEADLINE_S - (time.monotonic() - start))

        wait_until(lambda: server.poll() is None and
                   http("GET", prometheus_url + "/-/ready", timeout=2)[0] == 200,
                   left(), "Prometheus to be ready")

        # Eight GPU temperature series with dcgm-exporter's labels.
        series = wait_until(lambda: (lambda result: result if len(result) == 8 else None)(
            query(prometheus_url, "DCGM_FI_DEV_GPU_TEMP")), left(),
            "8 DCGM_FI_DEV_GPU_TEMP series in Prometheus")
        uuids = {gpu["index"]: gpu["uuid"]
                 for gpu in json.loads(http("GET", agent.url + "/v1/gpus")[1])["gpus"]}
        own = agent_values(agent.url, "DCGM_FI_DEV_GPU_TEMP")
        for entry in series:
            labels = entry["metric"]
            gpu = int(labels["gpu"])
            check(labels["UUID"] == uuids[gpu], f"UUID label of GPU {gpu}: {labels}")
            check(labels["modelName"] == "NVIDIA H100 80GB HBM3", f"modelName: {labels}")
            check(labels["Hostname"] == "e2e-node", f"Hostname: {labels}")
            check(labels["device"] == f"nvidia{gpu}", f"device: {labels}")
            check(labels["job"] == "gpufleet-agent" and labels["instance"] == agent_address,
                  f"target labels: {labels}")
            value = float(entry["value"][1])
            check(abs(value - own[gpu]) <= 2, f"GPU {gpu}: Prometheus has {value} C, the agent "
                                              f"says {own[gpu]} C")
        backend = query(prometheus_url, 'gpufleet_agent_backend_info{backend="sim"}')
        check(len(backend) == 1 and backend[0]["value"][1] == "1", f"backend info: {backend}")
        up = query(prometheus_url, 'up{job="gpufleet-agent"}')
        check(up and up[0]["value"][1] == "1", f"up: {up}")

        # An XID makes GPU 3 unhealthy, as Prometheus sees it.
        status, text = http("POST", agent.url + "/v1/sim/faults",
                            {"gpu": 3, "kind": "xid", "code": 79})
        check(status == 200, f"inject: HTTP {status}: {text}")
        unhealthy = wait_until(lambda: (lambda result: result if result and
                                        result[0]["value"][1] == "0" else None)(
            query(prometheus_url, 'gpufleet_gpu_healthy{gpu="3"}')), left(),
            "gpufleet_gpu_healthy{gpu=\"3\"} 0 in Prometheus")
        check(unhealthy[0]["metric"]["reason"] == "XID 79: GPU has fallen off the bus",
              f"reason label: {unhealthy[0]['metric']}")
        healthy = query(prometheus_url, 'gpufleet_gpu_healthy{gpu!="3"} == 1')
        check(len(healthy) == 7, f"the other GPUs: {healthy}")
        xid = query(prometheus_url, 'DCGM_FI_DEV_XID_ERRORS{gpu="3"}')
        check(xid and xid[0]["value"][1] == "79", f"XID gauge: {xid}")
        # The job on each GPU keeps its job_id label through Prometheus (a label named `job`
        # would be renamed exported_job).
        status, text = http("POST", agent.url + "/v1/workloads",
                            {"argv": ["sleep", "30"], "gpus": 2, "job_id": 7001, "grace": 0})
        check(status == 201, f"launch: HTTP {status}: {text}")
        workload = json.loads(text)
        jobs = wait_until(lambda: (lambda result: result if len(result) == 2 else None)(
            query(prometheus_url, 'gpufleet_gpu_job{job_id="7001"}')), left(),
            "gpufleet_gpu_job{job_id=\"7001\"} for two GPUs in Prometheus")
        check(sorted(int(entry["metric"]["gpu"]) for entry in jobs) == workload["gpus"],
              f"job series {jobs} for GPUs {workload['gpus']}")

        # Every query of the shipped Grafana dashboard is valid PromQL over these metrics, and
        # those without rate() already return data.
        dashboard_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                      "deploy", "grafana", "gpufleet-gpus.json")
        with open(dashboard_path) as file:
            dashboard = json.load(file)
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expression = target["expr"].replace("$Hostname", ".*").replace("$gpu", ".*")
                result = query(prometheus_url, expression)
                check(result or "rate(" in expression,
                      f"dashboard panel '{panel['title']}': no data for {expression}")
        http("POST", f"{agent.url}/v1/workloads/{workload['id']}/cancel", "")
        print(f"ok    Prometheus scraped the agent and saw the XID and the job "
              f"({time.monotonic() - start:.1f} s)")
    except (TestFailure, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as error:
        failed = True
        print(f"FAIL  {type(error).__name__}: {error}")
        for name in ("agent.log", "prometheus.log"):
            path = os.path.join(work, name)
            if os.path.exists(path):
                print(f"--- {name} ---\n" + open(path, errors="replace").read()[-4000:])
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
        for agent in agents:
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.wait(5)
        kill_recorded_workloads(data_dir)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
