#!/usr/bin/env python3
"""Routing quality of `gpufleet gateway`: round robin vs least outstanding vs the endpoint picker.

A shared-prefix workload over N replicas of the reference model server
(examples/model-server/gpufleet_reference_server.py): G groups of requests, each group sharing a
long prefix (a system prompt), each request adding a short unique suffix; streamed completions
with a small max_tokens, open-loop Poisson arrivals at a fixed rate, the same seeded sequence for
every policy. Each policy gets fresh replicas (restarted, so every prefix cache starts empty, and
warmed with one unrelated prompt so torch's first-call costs are paid before the clock starts)
and its own standalone gateway. The client measures the time to the first SSE `data:` chunk
(TTFT) and completions per second; the replicas' /metrics give the prefix-cache hit rate
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens) and how many
requests each served.

How each run really gets its policy: a route with `llm: true` always uses the endpoint picker,
and only llm routes are scraped and have their prompt read. So round_robin and
least_outstanding run on a plain route (`llm: false`) with `--policy` set, and endpoint_picker
on an `llm: true` route.

    python3 bench/routing_measure.py --gpufleet build/gpufleet [--rate 4] [--groups 16]
        [--duration 60] [--repetitions 3] [--json out.json] [-- reference-server flags]

docs/benchmarks.md ("Routing quality") records the figures and how to read them.

Loopback only; every process it starts is stopped on exit, Ctrl-C or failure.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "examples", "model-server", "gpufleet_reference_server.py")
POLICIES = ["round_robin", "least_outstanding", "endpoint_picker"]
MODEL = "bench"
PRINTABLE = "".join(chr(c) for c in range(32, 127))

children = []


def stop_children():
    for proc in children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 5
    for proc in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    children.clear()


def start(cmd, log_path):
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    children.append(proc)
    return proc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def wait_healthy(port, proc, path, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        try:
            if http_get(port, path, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} was not ready after {timeout} s")


def counter(text, name):
    """Sum of a metric's samples in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def workload(args):
    """The arrival sequence: (time offset, group, prompt), the same for every policy."""
    rng = random.Random(args.seed)
    prefixes = ["".join(rng.choice(PRINTABLE) for _ in range(args.prefix_tokens))
                for _ in range(args.groups)]
    arrivals = []
    t = 0.0
    while True:
        t += rng.expovariate(args.rate)
        if t >= args.duration:
            break
        group = rng.randrange(args.groups)
        suffix = "".join(rng.choice(PRINTABLE) for _ in range(args.suffix_tokens))
        arrivals.append((t, group, prefixes[group] + suffix))
    return arrivals


def one_request(port, prompt, max_tokens, timeout, result):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    started = time.monotonic()
    result["start"] = started
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        result["status"] = resp.status
        if resp.status != 200:
            resp.read()
            return
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                if "ttft" not in result:
                    result["ttft"] = time.monotonic() - started
                if line.strip() == b"data: [DONE]":
                    result["done"] = time.monotonic()
                    break
        conn.close()
    except (OSError, http.client.HTTPException) as error:
        result["error"] = str(error)


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def run_policy(args, policy, arrivals, work, run_id):
    """Fresh replicas and gateway; the workload; what it measured."""
    ports = [free_port() for _ in range(args.replicas)]
    procs = []
    for i, port in enumerate(ports):
        procs.append(start([args.python, SERVER, "--port", str(port), "--model-name", MODEL,
                            "--threads", "1", "--num-kv-blocks", str(args.num_kv_blocks)] +
                           args.server_args, os.path.join(work, f"{run_id}-replica{i}.log")))
    for i, (port, proc) in enumerate(zip(ports, procs)):
        wait_healthy(port, proc, "/health", 120, f"replica {i}")
    # torch's first forward pays one-off costs: pay them on a prompt unrelated to the groups.
    warm_rng = random.Random(-1)
    warm_prompt = "".join(warm_rng.choice(PRINTABLE) for _ in range(300))
    for port in ports:
        warm = {}
        one_request(port, warm_prompt, 4, 60, warm)
        if warm.get("status") != 200:
            raise RuntimeError(f"warm-up request to replica :{port} failed: {warm}")
    before = [http_get(port, "/metrics")[1] for port in ports]

    routes = os.path.join(work, f"{run_id}-routes.json")
    with open(routes, "w") as f:
        json.dump({"routes": [{"deployment": MODEL, "llm": policy == "endpoint_picker",
                               "models": [MODEL],
                               "endpoints": [f"127.0.0.1:{p}" for p in ports]}]}, f)
    gw_port = free_port()
    gateway = start([args.gpufleet, "gateway", "--routes", routes, "--no-auth", "--listen",
                     f"127.0.0.1:{gw_port}", "--policy", policy],
                    os.path.join(work, f"{run_id}-gateway.log"))
    wait_healthy(gw_port, gateway, "/healthz", 20, "gateway")
    if policy == "endpoint_picker":
        time.sleep(0.5)  # a few scrapes, so the picker has fresh numbers from the first request

    results = [{} for _ in arrivals]
    threads = []
    t0 = time.monotonic()
    lag = 0.0
    for (offset, _, prompt), result in zip(arrivals, results):
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            lag = max(lag, -delay)
        thread = threading.Thread(target=one_request,
                                  args=(gw_port, prompt, args.max_tokens, args.request_timeout,
                                        result), daemon=True)
        thread.start()
        threads.append(thread)
    drain_deadline = time.monotonic() + args.drain
    for thread in threads:
        thread.join(timeout=max(0.0, drain_deadline - time.monotonic()))
    finished_at = time.monotonic()

    after = [http_get(port, "/metrics")[1] for port in ports]
    gateway_metrics = http_get(gw_port, "/metrics")[1]
    stop_children()

    completed = [r for r in results if "done" in r]
    ttfts = [r["ttft"] for r in results if "ttft" in r]
    last_done = max((r["done"] for r in completed), default=finished_at)
    hits = [counter(a, "vllm:prefix_cache_hits_total") - counter(b, "vllm:prefix_cache_hits_total")
            for a, b in zip(after, before)]
    queries = [counter(a, "vllm:prefix_cache_queries_total") -
               counter(b, "vllm:prefix_cache_queries_total") for a, b in zip(after, before)]
    served = [counter(a, "vllm:request_success_total") - counter(b, "vllm:request_success_total")
              for a, b in zip(after, before)]
    return {
        "policy": policy,
        "run": run_id,
        "sent": len(arrivals),
        "completed": len(completed),
        "failed": sum(1 for r in results if "error" in r or r.get("status", 200) != 200),
        "unfinished": sum(1 for r in results if "done" not in r and "error" not in r and
                          r.get("status", 200) == 200),
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p90": percentile(ttfts, 90),
        "ttft_p99": percentile(ttfts, 99),
        "ttft_mean": statistics.fmean(ttfts) if ttfts else float("nan"),
        "throughput": len(completed) / max(1e-9, last_done - t0),
        "hit_rate": sum(hits) / sum(queries) if sum(queries) else float("nan"),
        "served_per_replica": [int(s) for s in served],
        "hit_rate_per_replica": [h / q if q else float("nan") for h, q in zip(hits, queries)],
        "client_max_lag_s": lag,
        "gateway_retries": counter(gateway_metrics, "gpufleet_gateway_retries_total"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpufleet", default=os.path.join(HERE, "..", "build", "gpufleet"))
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter with torch, for the reference server")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=1500,
                        help="shared prefix length (the server's tokens are bytes)")
    parser.add_argument("--suffix-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--num-kv-blocks", type=int, default=512,
                        help="each replica's KV pool, in 16-token blocks (512: ~5 prefixes)")
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--drain", type=float, default=30.0,
                        help="seconds to wait for outstanding requests after the last arrival")
    parser.add_argument("--request-timeout", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=3,
                        help="rounds of the three policies, interleaved")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("server_args", nargs="*",
                        help="after --: extra flags for every reference server")
    args = parser.parse_args()
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in POLICIES:
            parser.error(f"unknown policy {policy!r}; expected {', '.join(POLICIES)}")
    if not os.access(args.gpufleet, os.X_OK):
        parser.error(f"{args.gpufleet} is not an executable (build the gpufleet target)")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    arrivals = workload(args)
    print(f"{len(arrivals)} requests over {args.duration:.0f} s ({args.rate}/s Poisson), "
          f"{args.groups} groups x {args.prefix_tokens}-token prefix + {args.suffix_tokens} "
          f"unique, max_tokens {args.max_tokens}, {args.replicas} replicas "
          f"(--num-kv-blocks {args.num_kv_blocks}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    runs = []
    work = tempfile.mkdtemp(prefix="gpufleet-routing-")
    try:
        for rep in range(args.repetitions):
            # Rotate the order each round so no policy always runs first (or last).
            order = policies[rep % len(policies):] + policies[:rep % len(policies)]
            for policy in order:
                run = run_policy(args, policy, arrivals, work, f"{rep}-{policy}")
                run["load_average"] = os.getloadavg()[0]
                runs.append(run)
                print(f"  round {rep + 1} {policy}: TTFT p50 {run['ttft_p50'] * 1000:.0f} ms, "
                      f"p90 {run['ttft_p90'] * 1000:.0f} ms, {run['throughput']:.2f} req/s, "
                      f"hit rate {run['hit_rate']:.2f}, per replica {run['served_per_replica']},"
                      f" {run['failed']} failed, {run['unfinished']} unfinished, load "
                      f"{run['load_average']:.1f}", flush=True)
    except KeyboardInterrupt:
        print("interrupted; stopping replicas and gateways", file=sys.stderr)
        return 130
    finally:
        stop_children()
    print(f"logs in {work}")

    print("\npolicy             TTFT p50  TTFT p90  TTFT p99  req/s   hit rate  p90 vs RR  "
          "(medians over rounds)")
    medians = {}
    for policy in policies:
        mine = [r for r in runs if r["policy"] == policy]
        medians[policy] = {k: statistics.median(r[k] for r in mine)
                           for k in ("ttft_p50", "ttft_p90", "ttft_p99", "throughput",
                                     "hit_rate")}
    base = medians.get("round_robin", {}).get("ttft_p90")
    for policy, m in medians.items():
        ratio = f"{base / m['ttft_p90']:.1f}x lower" if base else "-"
        print(f"{policy:<18} {m['ttft_p50'] * 1000:6.0f} ms {m['ttft_p90'] * 1000:6.0f} ms "
              f"{m['ttft_p99'] * 1000:6.0f} ms {m['throughput']:6.2f}  {m['hit_rate']:7.2f}   "
              f"{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "medians": medians}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
