#!/usr/bin/env python3
"""`gpufleet agent --fleet N` against a real `gpufleet server` (docs/scale.md): the simulated nodes
register from their own loopback addresses, run `sleep` tasks for their time, refuse anything
else with a reason, stop cancelled tasks, and go lost when the fleet stops.

Usage: fleet_e2e_test.py PATH/TO/gpufleet [test_name ...]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_testlib import Cluster, Process, check, run_tests, wait_until  # noqa: E402

NODES = 40


def start_fleet(cluster, nodes=NODES, *extra):
    token = cluster.token("fleet", "ops", role="agent")
    fleet = Process([cluster.gpufleet, "agent", "--fleet", str(nodes), "--fleet-gpus", "8",
                     "--server", cluster.url, "--token", token, "--fleet-spread", "1s", *extra],
                    os.path.join(cluster.root, "fleet.log"), "fleet")
    cluster.agents["fleet"] = fleet
    line = fleet.read_until(r"backend fleet .*").group(0)
    check("simulated" in line and "timed sleeps" in line, f"the fleet's first line: {line}")
    wait_until(lambda: sum(1 for n in cluster.nodes() if n["state"] == "ready") == nodes, 30,
               f"{nodes} fleet nodes ready")
    return fleet


def test_fleet_nodes_register_and_run_sleeps(gpufleet):
    with Cluster(gpufleet, "fleet-run", server_args=["--node-timeout", "3s",
                                                     "--heartbeat", "1s"]) as cluster:
        cluster.start_server()
        fleet = start_fleet(cluster)
        nodes = cluster.nodes()
        addresses = {n["report"]["address"] for n in nodes}
        check(len(addresses) == NODES and all(a.startswith("127.10.") for a in addresses),
              f"each node its own loopback address: {sorted(addresses)[:5]}")
        check({n["report"]["backend"] for n in nodes} == {"fleet"},
              "every fleet node says backend fleet")
        check(all(len(n["report"]["gpus"]) == 8 for n in nodes), "8 GPUs each")

        short = cluster.submit({"command": ["sleep", "1.5"], "gpus": 8, "nodes": 2})
        started = time.monotonic()
        done = cluster.wait_state(short["id"], ("succeeded", "failed"), timeout=30)
        check(done["state"] == "succeeded", f"the 2-node sleep job: {done['state']} "
                                            f"{done.get('reason')}")
        check(time.monotonic() - started >= 1.4, "the sleep ended before its time")
        on = {task["node"] for task in done["tasks"]}
        check(len(on) == 2, f"2 distinct nodes for --nodes 2: {on}")

        refused = cluster.submit({"command": ["python3", "train.py"], "gpus": 1})
        failed = cluster.wait_state(refused["id"], ("failed", "succeeded"), timeout=30)
        check(failed["state"] == "failed" and "only `sleep SECONDS`" in str(failed),
              f"a command the fleet cannot run: {failed['state']} {failed.get('reason')}")

        long = cluster.submit({"command": ["sleep", "600"], "gpus": 4})
        cluster.wait_state(long["id"], "running", timeout=30)
        cluster.cli("cancel", str(long["id"]))
        cluster.wait_state(long["id"], "cancelled", timeout=30)
        # The fleet's own count says the node stopped it, not only the server.
        fleet.read_until(r"fleet: .* [1-9]\d* cancelled", timeout=25)

        fleet.stop()
        wait_until(lambda: all(n["state"] == "lost" for n in cluster.nodes()), 20,
                   "every fleet node lost once the fleet stops")


def test_fleet_refuses_bad_flags(gpufleet):
    with Cluster(gpufleet, "fleet-flags") as cluster:
        cluster.start_server()
        token = cluster.token("fleet", "ops", role="agent")
        for extra, message in [(["--fleet", "-3"], "at least 1"),
                               (["--fleet", "70000"], "at most 65000"),
                               (["--fleet", "2", "--fleet-gpus", "100"], "from 0 to 64"),
                               (["--fleet", "2", "--fleet-spread", "soon"], "--fleet-spread")]:
            result = cluster.cli("agent", *extra, "--server", cluster.url, "--token", token,
                                 check_code=2)
            check(message in result.stderr, f"{extra}: {result.stderr!r}")
        result = cluster.cli("agent", "--fleet", "2", check_code=2)
        check("--fleet needs --server" in result.stderr, result.stderr)


TESTS = [test_fleet_nodes_register_and_run_sleeps, test_fleet_refuses_bad_flags]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
