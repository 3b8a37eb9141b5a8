"""Jobs in containers through the real binaries (docs/containers.md): agents run each task of a
job that names an image in an OCI container (runc or crun under the shim), from images built
offline by scripts/test-images.sh (mmdebstrap root filesystems; one imported into podman as a
reference). Simulated GPUs get device files (--sim-device-dir), given to containers as CDI
devices, so a container's /dev shows which GPUs it holds.

Usage: container_e2e_test.py path/to/gpufleet"""

import json
import os
import re
import signal
import subprocess
import sys

from e2e_testlib import Cluster, check, run_tests, wait_until

IMAGES = os.environ.get("GPUFLEET_TEST_IMAGES", "/var/cache/gpufleet/test-images")
BASE_ARCHIVE = os.path.join(IMAGES, "base.tar")
TORCH_ARCHIVE = os.path.join(IMAGES, "torch.tar")
BASE_REFERENCE = "localhost/gpufleet-test:base"
E2E_DIR = os.path.dirname(os.path.abspath(__file__))


def require_images():
    for path in (BASE_ARCHIVE, TORCH_ARCHIVE):
        check(os.path.getsize(path) > 0 if os.path.exists(path) else False,
              f"{path} is missing: `make test-images` (scripts/test-images.sh) builds it")
    found = subprocess.run(["podman", "image", "exists", BASE_REFERENCE])
    check(found.returncode == 0, f"podman has no {BASE_REFERENCE}: run scripts/test-images.sh")


def start_container_agent(cluster, name, address="127.0.0.1", gpus="4xH100-80GB",
                          cache=None, token=None):
    # One image cache for a test's agents, as nodes sharing a disk would not; it keeps each
    # image unpacked once per test.
    cache = cache or os.path.join(cluster.root, "image-cache")
    return cluster.start_agent(name, address, gpus=gpus, token=token, extra_args=[
        "--sim-device-dir", os.path.join(cluster.root, f"dev-{name}"),
        "--cdi-dir", os.path.join(cluster.root, f"cdi-{name}"),
        "--image-cache-dir", cache])


def print_logs(cluster, job_id, tasks=(0,)):
    for task in tasks:
        for stream in ("stdout", "stderr"):
            try:
                print(f"--- task {task} {stream}:\n"
                      f"{cluster.logs(job_id, task=task, stream=stream)[-3000:]}")
            except Exception as error:  # noqa: BLE001 - diagnostics only
                print(f"--- task {task} {stream}: {error}")


def test_a_container_sees_its_gpus_mounts_and_env(gpufleet):
    require_images()
    with Cluster(gpufleet, "containers") as cluster:
        cluster.start_server()
        start_container_agent(cluster, "node-a")
        data = os.path.join(cluster.root, "dataset")
        checkpoints = os.path.join(cluster.root, "ckpt")
        os.makedirs(data)
        os.makedirs(checkpoints)
        os.chown(checkpoints, 1000, 1000)  # the job's user owns its checkpoints, as on shared storage
        with open(os.path.join(data, "shard-0"), "w") as file:
            file.write("tokens\n")
        # A 2-GPU job beside a 1-GPU one: the container's /dev holds its own GPUs only.
        cluster.submit({"command": ["sleep", "60"], "gpus": 1, "name": "neighbour"})
        script = ("ls /dev | grep nvidia; echo CVD=$CUDA_VISIBLE_DEVICES; "
                  "echo NODE=$GPUFLEET_NODE_GPU_INDICES; echo RANK=$RANK WORLD=$WORLD_SIZE; "
                  "cat /data/shard-0; touch /data/new 2>/dev/null && echo data-writable; "
                  "echo saved > /ckpt/step-1 && echo ckpt-written; id -u; id -g; pwd; "
                  "cat /etc/debian_version")
        job = cluster.submit({"name": "in-container", "gpus": 2, "image": BASE_ARCHIVE,
                              "mounts": [f"{data}:/data:ro", f"{checkpoints}:/ckpt:rw"],
                              "user": "1000:1000", "command": ["sh", "-c", script]})
        done = cluster.wait_state(job["id"], ("succeeded", "failed"), timeout=90)
        out = cluster.logs(job["id"])
        if done["state"] != "succeeded":
            print_logs(cluster, job["id"])
        check(done["state"] == "succeeded", f"job {done['state']}: {done['reason']}")
        indices = done["tasks"][0]["gpu_indices"]
        devices = sorted(line for line in out.splitlines() if line.startswith("nvidia"))
        check(devices == sorted(f"nvidia{i}" for i in indices),
              f"GPUs {indices}, but the container's /dev has {devices}: {out!r}")
        check("CVD=0,1" in out, f"CUDA_VISIBLE_DEVICES inside: {out!r}")
        check(f"NODE={','.join(map(str, indices))}" in out, f"node indices: {out!r}")
        check("RANK=0 WORLD=1" in out, f"the platform's env: {out!r}")
        check("tokens" in out and "data-writable" not in out, f"the read-only dataset: {out!r}")
        check("ckpt-written" in out, f"the checkpoint mount: {out!r}")
        with open(os.path.join(checkpoints, "step-1")) as file:
            check(file.read() == "saved\n", "the checkpoint did not reach the node")
        check("\n1000\n1000\n/gpufleet/work\n" in out, f"user and workdir: {out!r}")
        check(re.search(r"\n12\.\d+\n", out), f"not the Debian 12 image: {out!r}")
        print(f"  GPUs {indices} -> /dev/{devices}")

        # Refused before anything runs: a workdir that is relative, a mount without a target.
        status = cluster.cli("submit", "--image", BASE_ARCHIVE, "--mount", "/data", "--", "true",
                             check_code=None)
        check(status.returncode != 0 and "SOURCE:TARGET" in status.stderr, status.stderr)
        status = cluster.cli("submit", "--image", BASE_ARCHIVE, "--workdir", "rel", "--",
                             "true", check_code=None)
        check(status.returncode != 0 and "inside the container" in status.stderr, status.stderr)


def test_cancel_and_agent_restart_of_a_container_from_a_reference(gpufleet):
    require_images()
    with Cluster(gpufleet, "container-restart") as cluster:
        cluster.start_server()
        token = cluster.token("agent-node-a", "system", "agent")
        agent = start_container_agent(cluster, "node-a", token=token)
        script = ("trap 'echo got SIGTERM; exit 0' TERM; echo started; "
                  "while true; do sleep 0.2; done")
        submitted = cluster.cli("submit", "--gpus", "1", "--image", BASE_REFERENCE,
                                "--grace-period", "20s", "--", "sh", "-c", script)
        job_id = int(re.search(r"job (\d+) submitted", submitted.stdout).group(1))
        running = cluster.wait_state(job_id, "running", timeout=90)
        wait_until(lambda: "started" in cluster.logs(job_id), 20, "the container's output")
        workload = running["tasks"][0]["workload_id"]

        agent.stop(signal.SIGKILL)
        agent = start_container_agent(cluster, "node-a", token=token)
        check(cluster.job(job_id)["state"] == "running", "the job left running on restart")
        shown = cluster.cli("job", "show", str(job_id)).stdout
        check(BASE_REFERENCE in shown, f"`job` does not show the image: {shown}")

        cluster.cli("cancel", str(job_id))
        done = cluster.wait_state(job_id, "cancelled", timeout=30)
        wait_until(lambda: "got SIGTERM" in cluster.logs(job_id), 15,
                   "the container's SIGTERM handler (through its init) to run")
        with open(os.path.join(agent.data_dir, "workloads", workload, "spec.json")) as file:
            spec = json.load(file)
        container_id, runtime = spec["container_id"], spec["containers"]["runtime"]

        def runtime_lists_it():
            listed = subprocess.run([runtime, "list", "--quiet"], capture_output=True, text=True)
            return container_id in listed.stdout.split()
        wait_until(lambda: not runtime_lists_it(), 15, f"{runtime} to forget {container_id}")
        print(f"  re-adopted after kill -9 of the agent, cancelled: {done['reason']}")


def test_bad_images_fail_with_their_reason(gpufleet):
    require_images()
    with Cluster(gpufleet, "container-bad") as cluster:
        cluster.start_server()
        start_container_agent(cluster, "node-a")
        not_an_image = os.path.join(cluster.root, "notes.txt")
        with open(not_an_image, "w") as file:
            file.write("not a tarball\n")
        cases = {"/nonexistent/image.tar": "No such file or directory",
                 not_an_image: "unpack image archive",
                 "localhost/gpufleet-test:missing": "pull image 'localhost/gpufleet-test:missing'"}
        jobs = {image: cluster.submit({"image": image, "command": ["true"], "gpus": 1})["id"]
                for image in cases}
        for image, expected in cases.items():
            done = cluster.wait_state(jobs[image], ("failed", "succeeded"), timeout=60)
            check(done["state"] == "failed" and "failed to start" in done["reason"] and
                  expected in done["reason"], f"{image}: {done['state']}: {done['reason']}")
            print(f"  {image}: {done['reason'][:140]}")
        # The node is fine afterwards: a good image runs.
        good = cluster.submit({"image": BASE_ARCHIVE, "command": ["true"], "gpus": 1})
        check(cluster.wait_state(good["id"], ("succeeded", "failed"), 60)["state"] == "succeeded",
              "a good image after the bad ones")


def test_two_node_ddp_in_containers(gpufleet):
    require_images()
    with Cluster(gpufleet, "container-ddp") as cluster:
        cluster.start_server()
        # A fresh cache: the first start prepares the image, and the job says so meanwhile.
        cache = os.path.join(cluster.root, "ddp-cache")
        start_container_agent(cluster, "node-a", "127.0.0.2", gpus="2xH100-80GB", cache=cache)
        start_container_agent(cluster, "node-b", "127.0.0.3", gpus="2xH100-80GB", cache=cache)
        job = cluster.submit({"name": "ddp", "nodes": 2, "gpus": 1, "image": TORCH_ARCHIVE,
                              "mounts": [f"{E2E_DIR}:/job:ro"],
                              "command": ["python3", "/job/ddp_train.py"]})
        reasons = set()

        def finished():
            current = cluster.job(job["id"])
            reasons.add(current["reason"])
            return current if current["state"] in ("succeeded", "failed", "cancelled") else None
        try:
            done = wait_until(finished, 200, "the DDP job to finish")
        except Exception:
            print_logs(cluster, job["id"], (0, 1))
            raise
        rank0 = cluster.logs(job["id"], task=0)
        rank1 = cluster.logs(job["id"], task=1)
        if done["state"] != "succeeded":
            print_logs(cluster, job["id"], (0, 1))
        check(done["state"] == "succeeded", f"job {done['state']}: {done['reason']}")
        check({task["node"] for task in done["tasks"]} == {"node-a", "node-b"}, "one node")
        check("rank 0 done" in rank0 and "rank 1 done" in rank1, "a rank did not finish")
        first = float(re.search(r"loss_first ([\d.]+)", rank0).group(1))
        last = float(re.search(r"loss_last ([\d.]+)", rank0).group(1))
        check(last < first / 100, f"the loss went from {first} to {last}")
        check(any("preparing image" in reason for reason in reasons),
              f"the job never said it waited for its image: {sorted(reasons)}")
        print(f"  loss {first:.4f} -> {last:.6f} in containers on 2 nodes; "
              f"while starting: {[r for r in reasons if 'image' in r][:1]}")


TESTS = [test_a_container_sees_its_gpus_mounts_and_env,
         test_cancel_and_agent_restart_of_a_container_from_a_reference,
         test_bad_images_fail_with_their_reason, test_two_node_ddp_in_containers]

if __name__ == "__main__":
    wanted = sys.argv[2:]
    run_tests([test for test in TESTS if not wanted or test.__name__ in wanted])
