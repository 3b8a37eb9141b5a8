#!/usr/bin/env python3
"""Requests/s and p99 latency through `gpufleet gateway` vs nginx and HAProxy as reverse proxies.

All three proxy the same static backend (an nginx answering a fixed 200 body) with keep-alive to
the backend, one worker/thread each, pinned to the same CPU; wrk and the backend share the other
CPU(s). Each proxy gets the same wrk run (threads, connections, duration); the table and the
ratios to the gateway go to stdout (docs/benchmarks.md records them).

    python3 bench/gateway_measure.py --gpufleet build-release/gpufleet [--connections 32]
        [--duration 10] [--rounds 3] [--sse [--events 8] [--interval-us 0]]

--sse: the backend is bench/sse_backend (a C++ Asio server answering each request with a chunked
text/event-stream of --events events, each its own send) and nginx is configured as its docs say
for SSE (proxy_buffering off): every proxy passes the stream through as it comes.

The gateway binary is whichever --gpufleet names: measure a Release build (-O3, as nginx and
HAProxy are built optimised), e.g. `cmake -S . -B build-release -G Ninja
-DCMAKE_BUILD_TYPE=Release && cmake --build build-release -j2 --target gpufleet`.

Needs wrk, nginx and haproxy on PATH (Debian: apt-get install wrk nginx-light haproxy).
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def nginx_conf(work, port, body, upstream_port=None, sse=False):
    logs = os.path.join(work, f"nginx-{port}")
    os.makedirs(logs, exist_ok=True)
    if upstream_port is None:
        location = f'return 200 "{body}";'
        upstream = ""
    else:
        upstream = (f"upstream backend {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}")
        location = ('proxy_pass http://backend; proxy_http_version 1.1; '
                    'proxy_set_header Connection "";' + (" proxy_buffering off;" if sse else ""))
    conf = os.path.join(logs, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
worker_processes 1;
daemon off;
pid {logs}/nginx.pid;
error_log {logs}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {logs}/body;
  proxy_temp_path {logs}/proxy;
  fastcgi_temp_path {logs}/fastcgi;
  uwsgi_temp_path {logs}/uwsgi;
  scgi_temp_path {logs}/scgi;
  keepalive_requests 1000000;
  {upstream}
  server {{
    listen 127.0.0.1:{port};
    location / {{ {location} }}
  }}
}}
""")
    return ["nginx", "-c", conf, "-p", logs]


def haproxy_conf(work, port, upstream_port):
    conf = os.path.join(work, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend front
  bind 127.0.0.1:{port}
  default_backend back
backend back
  server b1 127.0.0.1:{upstream_port}
""")
    return ["haproxy", "-f", conf, "-db"]


def gateway_cmd(work, gpufleet, port, upstream_port):
    routes = os.path.join(work, "routes.yaml")
    with open(routes, "w") as f:
        f.write(f'routes:\n  - deployment: static\n    endpoints: ["127.0.0.1:{upstream_port}"]\n')
    return [gpufleet, "gateway", "--routes", routes, "--no-auth", "--listen",
            f"127.0.0.1:{port}", "--io-threads", "1"]


def pinned(cpus, command):
    return ["taskset", "-c", cpus] + command


def run_wrk(args, port, path):
    command = pinned(args.client_cpus, ["wrk", "-t", str(args.threads), "-c", str(args.connections),
                                        "-d", f"{args.duration}s", "--latency",
                                        f"http://127.0.0.1:{port}{path}"])
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99_text = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1000.0}[p99_text.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, float(p99_text.group(1)) * scale, int(errors.group(1)) if errors else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpufleet", default="build/gpufleet")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="wrk runs per proxy, alternating")
    parser.add_argument("--proxy-cpu", default="0")
    parser.add_argument("--client-cpus", default="1", help="wrk and the backend")
    parser.add_argument("--body", default="hello from the static backend")
    parser.add_argument("--sse", action="store_true", help="proxy SSE streams (bench/sse_backend)")
    parser.add_argument("--sse-backend", default="build-release/bench/sse_backend")
    parser.add_argument("--events", type=int, default=8, help="--sse: events per stream")
    parser.add_argument("--interval-us", type=int, default=0, help="--sse: between events")
    args = parser.parse_args()
    if args.sse and not os.access(args.sse_backend, os.X_OK):
        sys.exit(f"error: {args.sse_backend} not found: build the sse_backend target "
                 "(cmake --build build-release --target sse_backend)")
    for tool in ("wrk", "nginx", "haproxy", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"error: {tool} not found (apt-get install wrk nginx-light haproxy)")

    work = tempfile.mkdtemp(prefix="gateway-bench-")
    backend_port = free_port()
    processes = []

    def start(command, port):
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        processes.append(process)
        if not wait_for_port(port):
            process.kill()
            sys.exit(f"error: {' '.join(command)} did not listen on {port}: "
                     f"{process.stderr.read().decode()}")
        return process

    def stop(process):
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    results = {}
    try:
        if args.sse:
            backend = [args.sse_backend, "--port", str(backend_port), "--events",
                       str(args.events), "--interval-us", str(args.interval_us)]
        else:
            backend = nginx_conf(work, backend_port, args.body)
        start(pinned(args.client_cpus, backend), backend_port)
        baseline = run_wrk(args, backend_port, "/")
        proxies = [
            ("gpufleet gateway", lambda p: gateway_cmd(work, args.gpufleet, p, backend_port),
             "/d/static/"),
            ("nginx", lambda p: nginx_conf(work, p, args.body, backend_port, args.sse), "/"),
            ("haproxy", lambda p: haproxy_conf(work, p, backend_port), "/"),
        ]
        # All three run at once (idle ones cost nothing) and the rounds alternate between them,
        # so that load from elsewhere on the machine hits each alike; medians are reported.
        targets = []
        for name, make, path in proxies:
            port = free_port()
            start(pinned(args.proxy_cpu, make(port)), port)
            run_wrk(argparse.Namespace(**{**vars(args), "duration": 2}), port, path)  # warm-up
            targets.append((name, port, path))
        runs = {name: [] for name, _, _ in targets}
        for _ in range(args.rounds):
            for name, port, path in targets:
                runs[name].append(run_wrk(args, port, path))
        for name, samples in runs.items():
            results[name] = (statistics.median(r[0] for r in samples),
                             statistics.median(r[1] for r in samples), sum(r[2] for r in samples))
    finally:
        for process in processes:
            if process.poll() is None:
                stop(process)
        shutil.rmtree(work, ignore_errors=True)

    if args.sse:
        print(f"SSE: {args.events} events a stream, {args.interval_us} us apart")
    print(f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s --latency, {args.rounds} "
          f"rounds (medians); proxy on CPU {args.proxy_cpu}, wrk and backend on CPU "
          f"{args.client_cpus}")
    print(f"backend alone: {baseline[0]:.0f} req/s, p99 {baseline[1]:.2f} ms\n")
    gateway_rps, gateway_p99, _ = results["gpufleet gateway"]
    print("| proxy | requests/s | p99 (ms) | non-2xx | req/s vs gateway | p99 vs gateway |")
    print("|---|---|---|---|---|---|")
    for name, (rps, p99, errors) in results.items():
        print(f"| {name} | {rps:.0f} | {p99:.2f} | {errors} | {rps / gateway_rps:.2f} | "
              f"{p99 / gateway_p99:.2f} |")


if __name__ == "__main__":
    main()
