#!/usr/bin/env python3
"""Measures the reference model server (examples/model-server/gpufleet_reference_server.py) on
this machine (docs/reference-model-server.md, "Performance"):

1. prefill tokens/s: distinct ~1000-token prompts with max_tokens=1, one at a time and 4 at once;
2. decode tokens/s: short prompts streaming 256 tokens, one at a time and 4 at once (from each
   stream's first token to its last);
3. time to first token of a ~1500-token prompt on a cold prefix cache and on a hit.

It starts its own server (Debian's /usr/bin/python3, default flags plus SERVER_ARGS) on a free
loopback port and stops it at the end.

Usage: bench/reference_server_measure.py [--repeats 3] [-- SERVER_ARGS...]
"""

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import threading
import time

TORCH_PYTHON = "/usr/bin/python3"
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                      "model-server", "gpufleet_reference_server.py")


def start_server(extra):
    process = subprocess.Popen([TORCH_PYTHON, SERVER, "--port", "0", *extra],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        if match:
            port = int(match.group(1))
            break
    else:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit("the server did not get ready")


def stream(port, prompt, max_tokens):
    """Streams one completion; returns (start, first token time, last token time, tokens)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}),
        {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = last = None
    tokens = 0
    for line in response:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        text = json.loads(line[6:])["choices"][0]["text"]
        if text:
            last = time.perf_counter()
            first = first or last
            tokens += len(text)
    connection.close()
    return started, first, last, tokens


def concurrently(jobs):
    results = [None] * len(jobs)

    def run(index, job):
        results[index] = job()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def random_prompt(rng, length):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(length))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("server_args", nargs="*")
    args = parser.parse_args()
    rng = random.Random(1)
    process, port = start_server(args.server_args)
    try:
        stream(port, "warm up", 8)
        rows = []
        for concurrency in (1, 4):
            rates = []
            for _ in range(args.repeats):
                prompts = [random_prompt(rng, 1000) for _ in range(concurrency)]
                started = time.perf_counter()
                results = concurrently([lambda p=p: stream(port, p, 1) for p in prompts])
                wall = max(r[1] for r in results) - started
                rates.append(concurrency * 1001 / wall)
            rows.append((f"prefill, {concurrency} sequence(s), 1000-token prompts",
                         statistics.median(rates)))
        for concurrency in (1, 4):
            rates = []
            for _ in range(args.repeats):
                prompts = [f"decode {rng.random()}" for _ in range(concurrency)]
                results = concurrently([lambda p=p: stream(port, p, 256) for p in prompts])
                span = max(r[2] for r in results) - min(r[1] for r in results)
                rates.append(sum(r[3] - 1 for r in results) / span)
            rows.append((f"decode, {concurrency} sequence(s), 256 tokens each (all together)",
                         statistics.median(rates)))
        misses, hits = [], []
        for _ in range(args.repeats):
            prompt = random_prompt(rng, 1500)
            for times in (misses, hits):
                started, first, _, _ = stream(port, prompt, 1)
                times.append(first - started)
        print(f"{'measure':<62} {'value':>10}")
        for name, rate in rows:
            print(f"{name:<62} {rate:>8.0f} tokens/s")
        print(f"{'TTFT, 1500-token prompt, cold prefix cache':<62} "
              f"{statistics.median(misses) * 1000:>8.0f} ms")
        print(f"{'TTFT, 1500-token prompt, prefix cache hit':<62} "
              f"{statistics.median(hits) * 1000:>8.0f} ms")
    finally:
        process.terminate()
        process.wait(30)


if __name__ == "__main__":
    main()
