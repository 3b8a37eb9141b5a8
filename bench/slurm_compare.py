#!/usr/bin/env python3
"""gpufleet side by side with a real Slurm 22.05 on the same work (docs/benchmarks.md, "Slurm").

Both get the same cluster, N nodes x 8 GPUs on loopback, and the same seeded list of jobs, the mix
of issue 14: 60 % 1 GPU, 20 % 2, 10 % 4, 8 % 8, 2 % 16 as 2 nodes x 8, each `sleep` 60-180 s.
- Slurm: Debian's slurm-wlm (slurmctld, and one slurmd per virtual node, `slurmd -N nK`, each on
  its own port; count-only GRES gpu:8; select/cons_tres, sched/backfill), jobs sent with `sbatch`.
- gpufleet: `gpufleet server` (SQLite) and `gpufleet agent --fleet N`, jobs sent two ways, each
  on a fresh cluster: `gpufleet submit`, one process per job as sbatch is (--via cli), and
  POST /api/v1/jobs over keep-alive connections (--via api); --parallel at a time.
For each: submissions/s, the time from the first submission until no job is pending (each has
started), and the controller's CPU (slurmctld, gpufleet server) over that span per job.

Usage: bench/slurm_compare.py PATH/TO/gpufleet [--nodes 1000] [--jobs 1000] [--parallel 8]
Needs root (slurmd, munged) and slurm-wlm + munge (apt-get install slurm-wlm).
"""

import argparse
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "e2e"))
from e2e_testlib import Cluster, Process, api, wait_until  # noqa: E402
from fleet_measure import (Submitter, cpu_seconds, mix_job, queue_counts, ready_nodes,  # noqa: E402
                           submit_many)

SLURM_CONF = """ClusterName=bench
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=error
SlurmdDebug=error
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
MaxJobCount=200000
SlurmdTimeout=600
InactiveLimit=0
KillWait=5
NodeName=n[1-{nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[{first_port}-{last_port}] CPUs=64 RealMemory=100000 Gres=gpu:8 State=UNKNOWN
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def poll(predicate, timeout, what, interval=0.5):
    """Slower than wait_until: each look costs the controller CPU, which is what is measured."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def jobs_for(count, seed):
    rng = random.Random(seed)
    return [mix_job(rng) for _ in range(count)]


def run_parallel(commands, parallel, env):
    def one(argv):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr}")
        return result.stdout
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, commands))


def measure_gpufleet(gpufleet, args, jobs, via):
    """via "cli": one `gpufleet submit` process per job, as sbatch is for Slurm; "api": the same
    jobs POSTed by --parallel keep-alive clients, as a pipeline or SDK would."""
    with Cluster(gpufleet, "slurm-compare",
                 server_args=["--max-connections", str(2 * args.nodes + 1000)]) as cluster:
        server = cluster.start_server()
        token = cluster.token("fleet", "ops", role="agent")
        fleet = Process([gpufleet, "agent", "--fleet", str(args.nodes), "--server", cluster.url,
                         "--token", token, "--fleet-spread", "5s"],
                        os.path.join(cluster.root, "fleet.log"), "fleet")
        cluster.agents["fleet"] = fleet
        wait_until(lambda: ready_nodes(cluster, "fleet-") == args.nodes, 180, "fleet ready")
        time.sleep(5)
        env = dict(os.environ, GPUFLEET_SERVER=cluster.url, GPUFLEET_TOKEN=cluster.admin_token)
        commands = []
        for job in jobs:
            argv = [gpufleet, "submit", "--gpus", str(job["gpus"]), "--name", "mix",
                    "--gpu-model", job["gpu_model"]]
            if "nodes" in job:
                argv += ["--nodes", str(job["nodes"])]
            commands.append(argv + ["--", *job["command"]])
        submitter = Submitter(cluster.url, cluster.admin_token)
        pid = server.process.pid
        cpu0, t0, wall0 = cpu_seconds(pid), time.monotonic(), time.time()
        if via == "cli":
            run_parallel(commands, args.parallel, env)
        else:
            submit_many(submitter, jobs, args.parallel)
        submitted = time.monotonic() - t0
        poll(lambda: queue_counts(cluster)[0] == 0, 600, "every job placed")
        # Every job's `running` event, stamped by the server when its node said so.
        status, body = api(cluster.url, cluster.admin_token, "GET",
                           f"/api/v1/jobs?limit={len(jobs) + 10}", timeout=60)
        assert status == 200, body
        last_running = 0
        for job in body["jobs"]:
            _, detail = api(cluster.url, cluster.admin_token, "GET", f"/api/v1/jobs/{job['id']}")
            times = [e["time_ms"] for e in detail["events"] if e["to"] == "running"]
            assert times, f"job {job['id']} never ran: {detail['state']} {detail.get('reason')}"
            last_running = max(last_running, times[0])
        placed = last_running / 1000 - wall0
        cpu = cpu_seconds(pid) - cpu0
        fleet.stop()
        return len(jobs) / submitted, placed, 1000 * cpu / len(jobs)


def measure_slurm(args, jobs):
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install slurm-wlm")
    root = tempfile.mkdtemp(prefix="gpufleet-slurm-")
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(root, sub))
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w") as out:
        out.write(SLURM_CONF.format(root=root, nodes=args.nodes, ctld_port=16817,
                                    first_port=20001, last_port=20000 + args.nodes))
    with open(os.path.join(root, "gres.conf"), "w") as out:
        # No NodeName: slurmd -N matches gres.conf lines by host name, not by its -N name. Slurm's
        # gpu plugin drops GPUs without device files ("file-less GPU"), so eight existing
        # character devices stand in; task/none puts no job in a device cgroup.
        out.write("Name=gpu Count=8 File=/dev/tty[0-7]\n")
    env = dict(os.environ, SLURM_CONF=conf)
    daemons = []
    try:
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            os.makedirs("/run/munge", exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        ctld = subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(root, "slurmctld.err"), "w"))
        daemons.append(ctld)
        time.sleep(3)
        for i in range(1, args.nodes + 1):
            daemons.append(subprocess.Popen(["slurmd", "-D", "-N", f"n{i}"], env=env,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
            if i % 100 == 0:
                time.sleep(1)

        def idle_nodes():
            out = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env,
                                 capture_output=True, text=True).stdout
            return len(out.split())
        wait_until(lambda: idle_nodes() == args.nodes, 600, f"{args.nodes} slurmd nodes idle")
        print(f"slurm: {args.nodes} slurmd idle", file=sys.stderr, flush=True)
        time.sleep(5)
        commands = []
        for job in jobs:
            argv = ["sbatch", "--parsable", "-J", "mix", "-o", "/dev/null", "-N",
                    str(job.get("nodes", 1)), f"--gres=gpu:{job['gpus']}"]
            commands.append(argv + ["--wrap", " ".join(job["command"])])
        cpu0, t0 = cpu_seconds(ctld.pid), time.monotonic()
        run_parallel(commands, args.parallel, env)
        submitted = time.monotonic() - t0

        print(f"slurm: {len(jobs)} jobs submitted in {submitted:.1f} s", file=sys.stderr,
              flush=True)

        # Placed once none is pending: the first jobs (60 s and more) may end before the last
        # starts, so "all running at once" need never happen.
        def pending():
            out = subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%i"], env=env,
                                 capture_output=True, text=True).stdout
            return len(out.split())
        poll(lambda: pending() == 0, 900, "no Slurm job pending")
        placed = time.monotonic() - t0
        cpu = cpu_seconds(ctld.pid) - cpu0
        subprocess.run(["scancel", "-u", "root"], env=env)
        return len(jobs) / submitted, placed, 1000 * cpu / len(jobs)
    finally:
        for daemon in reversed(daemons):
            daemon.kill()
        for daemon in daemons:
            daemon.wait()
        subprocess.run(["pkill", "-f", "slurmstepd"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gpufleet")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--only", choices=("slurm", "gpufleet"))
    parser.add_argument("--via", default="cli,api",
                        help="how gpufleet's jobs are sent: cli, api, or both (cli,api)")
    args = parser.parse_args()
    for via in args.via.split(","):
        if via not in ("cli", "api"):
            parser.error(f"--via {args.via}: '{via}' is neither cli nor api")
    jobs = jobs_for(args.jobs, args.seed)
    results = {}
    line = ("{}: {:.1f} submissions/s, all placed {:.2f} s after the first submission, "
            "{:.2f} ms controller CPU per job")
    if args.only != "slurm":
        for via in args.via.split(","):
            name = f"gpufleet ({via})"
            results[name] = measure_gpufleet(os.path.abspath(args.gpufleet), args, jobs, via)
            print(line.format(name, *results[name]), flush=True)
    if args.only != "gpufleet":
        results["slurm"] = measure_slurm(args, jobs)
        print(line.format("slurm (sbatch)", *results["slurm"]), flush=True)
    if "slurm" in results:
        s = results["slurm"]
        for name, g in results.items():
            if name != "slurm":
                print(f"{name} vs slurm: submissions/s {g[0] / s[0]:.1f}x, time to place all "
                      f"{s[1] / g[1]:.1f}x, controller CPU per job {s[2] / g[2]:.1f}x")


if __name__ == "__main__":
    main()
