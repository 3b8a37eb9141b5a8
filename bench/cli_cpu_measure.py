#!/usr/bin/env python3
"""CPU time (user + system) of one CLI process, for two or more builds side by side: each round
runs every binary --per times in turn, so load from elsewhere hits each alike; prints the median,
min and max over rounds of the per-process mean. Point it at a running server through
GPUFLEET_SERVER / GPUFLEET_TOKEN (or ./.gpufleet/client.json, as `gpufleet dev` writes it).
docs/benchmarks.md ("CLI start") has the figures.

Usage: bench/cli_cpu_measure.py OLD/gpufleet,NEW/gpufleet [--rounds 15] [--per 10] -- VERB ARGS...
  e.g. bench/cli_cpu_measure.py /tmp/old/gpufleet,build/gpufleet -- submit --gpus 1 -- sleep 1000
"""

import argparse
import resource
import statistics
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", help="comma-separated gpufleet binaries")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per", type=int, default=10)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    verb = argv[split + 1:]
    if not verb:
        parser.error("give the CLI call after --, e.g. -- whoami")
    binaries = args.binaries.split(",")
    per_process = {binary: [] for binary in binaries}
    for _ in range(args.rounds):
        for binary in binaries:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            for _ in range(args.per):
                done = subprocess.run([binary, *verb], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE)
                if done.returncode != 0:
                    sys.exit(f"{binary} {' '.join(verb)}: exit {done.returncode}: "
                             f"{done.stderr.decode(errors='replace').strip()}")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            per_process[binary].append(1000 * cpu / args.per)
    for binary, values in per_process.items():
        print(f"{binary}: median {statistics.median(values):.2f} ms CPU per process "
              f"(min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
