"""A real distributed training job: Debian's python3-torch runs tests/e2e/ddp_train.py as a
job on 2 nodes (`"nodes": 2`: one task on each of two agents on separate loopback addresses;
each has 2 GPUs, so only the job's ask keeps both tasks off one node), rendezvousing through the MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE
gpufleet gives it, over gloo on the CPU. The job must succeed with the loss going down.

Usage: ddp_e2e_test.py path/to/gpufleet"""

import os
import re

from e2e_testlib import Cluster, check, run_tests

TORCH_PYTHON = "/usr/bin/python3"  # Debian's interpreter, where python3-torch is installed
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")


def test_two_node_ddp_training(gpufleet):
    with Cluster(gpufleet, "ddp") as cluster:
        cluster.start_server()
        cluster.start_agent("node-a", "127.0.0.2", gpus="2xH100-80GB")
        cluster.start_agent("node-b", "127.0.0.3", gpus="2xH100-80GB")
        job = cluster.submit({"name": "ddp", "nodes": 2, "gpus": 1,
                              "command": [TORCH_PYTHON, SCRIPT]})
        try:
            done = cluster.wait_state(job["id"], ("succeeded", "failed", "cancelled"),
                                      timeout=180)
        except Exception:
            for task in (0, 1):
                for stream in ("stdout", "stderr"):
                    print(f"--- rank {task} {stream}:\n"
                          f"{cluster.logs(job['id'], task=task, stream=stream)[-3000:]}")
            raise
        rank0 = cluster.logs(job["id"], task=0)
        rank1 = cluster.logs(job["id"], task=1)
        errors = cluster.logs(job["id"], task=0, stream="stderr")
        check(done["state"] == "succeeded",
              f"job {done['state']}: {done['reason']}; rank 0 stderr: {errors[-1500:]}")
        nodes = {task["node"] for task in done["tasks"]}
        check(nodes == {"node-a", "node-b"}, f"the gang ran on {nodes}")
        check("rank 0 of 2 (MASTER_ADDR=127.0.0.2" in rank0 or
              "rank 0 of 2 (MASTER_ADDR=127.0.0.3" in rank0, f"rank 0 said {rank0[:300]!r}")
        check("rank 1 of 2" in rank1 and "NODE_RANK=1" in rank1, f"rank 1 said {rank1!r}")
        check("rank 0 done" in rank0 and "rank 1 done" in rank1, "a rank did not finish")
        first = float(re.search(r"loss_first ([\d.]+)", rank0).group(1))
        last = float(re.search(r"loss_last ([\d.]+)", rank0).group(1))
        check(last < first / 100, f"the loss went from {first} to {last}")
        print(f"  loss {first:.4f} -> {last:.6f} over 30 epochs on 2 nodes")


if __name__ == "__main__":
    run_tests([test_two_node_ddp_training])
