#!/usr/bin/env python3
"""Measures how long a workload takes to start in an OCI container compared with a plain process,
through the real binary: `gpufleet agent run [--image IMAGE] -- sh -c 'date +%s%N'` on simulated
GPUs, N times each, interleaved. A start is the time from spawning `gpufleet agent run` to the
workload's first instruction (the nanosecond clock it prints), so both sides carry the same
in-process agent start-up; the container's extra is the difference. The image is prepared once
before the runs (the cold first start is reported apart), as a node's cache holds it.
docs/benchmarks.md ("Container start") has the figures and the command.

Usage: bench/container_start_measure.py PATH/TO/gpufleet [--starts 50]
                                        [--image /var/cache/gpufleet/test-images/base.tar]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "agent"))
from agent_testlib import die_with_parent  # noqa: E402

DEFAULT_IMAGE = os.path.join(
    os.environ.get("GPUFLEET_TEST_IMAGES", "/var/cache/gpufleet/test-images"), "base.tar")


def percentile(sorted_values, fraction):
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def start_ms(gpufleet, root, image):
    """One `agent run`: milliseconds from spawn to the workload's clock reading."""
    command = [gpufleet, "agent", "--data-dir", os.path.join(root, "agent"),
               "--sim-gpus", "4xH100-80GB", "--sim-device-dir", os.path.join(root, "dev"),
               "--cdi-dir", os.path.join(root, "cdi"),
               "--image-cache-dir", os.path.join(root, "images"), "run", "--gpus", "1"]
    if image:
        command += ["--image", image]
    command += ["--", "sh", "-c", "date +%s%N"]
    spawned_ns = time.time_ns()
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=die_with_parent,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    lines = done.stdout.split()
    if not lines or not lines[0].isdigit():
        raise SystemExit(f"no clock reading from the workload: {done.stdout!r} {done.stderr!r}")
    return (int(lines[0]) - spawned_ns) / 1e6, done.stderr


def summary(name, values):
    ordered = sorted(values)
    return (f"{name:9} n={len(ordered)} p50 {percentile(ordered, 0.5):7.1f} ms  "
            f"p99 {percentile(ordered, 0.99):7.1f} ms  mean {statistics.mean(ordered):7.1f} ms  "
            f"min {ordered[0]:6.1f}  max {ordered[-1]:6.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpufleet")
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    args = parser.parse_args()
    if not os.path.exists(args.image) and "/" in args.image and ":" not in args.image:
        raise SystemExit(f"{args.image} is missing: `make test-images` builds it")

    root = tempfile.mkdtemp(prefix="gpufleet-container-start-")
    try:
        cold, _ = start_ms(args.gpufleet, root, args.image)
        print(f"cold start (image prepared into the cache): {cold:.1f} ms")
        processes, containers = [], []
        for _ in range(args.starts):
            # Interleaved, so drift in the machine's load falls on both alike.
            processes.append(start_ms(args.gpufleet, root, None)[0])
            containers.append(start_ms(args.gpufleet, root, args.image)[0])
        print(summary("process", processes))
        print(summary("container", containers))
        p50_extra = percentile(sorted(containers), 0.5) - percentile(sorted(processes), 0.5)
        p99_extra = percentile(sorted(containers), 0.99) - percentile(sorted(processes), 0.99)
        print(f"container extra: p50 +{p50_extra:.1f} ms, p99 +{p99_extra:.1f} ms "
              f"(p50 ratio {percentile(sorted(containers), 0.5) / percentile(sorted(processes), 0.5):.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
