"""A tiny data-parallel training run: what a user's torchrun script does, scaled down.

Reads the gang's rendezvous from the environment gpufleet gives every task (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK), trains a linear model with DistributedDataParallel over gloo
(CPU), and prints the loss each epoch. Rank 0 prints "loss_first" and "loss_last" at the end.
"""

import datetime
import faulthandler
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    # A rank that hangs prints where (every thread's stack, to stderr) and exits, so a stuck run
    # says why instead of running into the test's timeout silently.
    faulthandler.dump_traceback_later(100, exit=True)
    # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE. A collective that waits on a
    # lost peer raises after the timeout rather than gloo's default of 30 minutes.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    world = dist.get_world_size()
    print(f"rank {rank} of {world} (MASTER_ADDR={os.environ['MASTER_ADDR']}, "
          f"NODE_RANK={os.environ.get('NODE_RANK')}, LOCAL_RANK={os.environ.get('LOCAL_RANK')})",
          flush=True)

    torch.manual_seed(0)
    true_weight = torch.tensor([[2.0, -3.0, 0.5]])
    inputs = torch.randn(512, 3)
    targets = inputs @ true_weight.T + 0.01 * torch.randn(512, 1)
    # Each rank trains on its own shard, as a DistributedSampler would give it.
    shard = slice(rank * len(inputs) // world, (rank + 1) * len(inputs) // world)
    inputs, targets = inputs[shard], targets[shard]

    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()  # gradients are all-reduced across the gang here
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world
        losses.append(mean_loss.item())
        if rank == 0:
            print(f"epoch {epoch} loss {losses[-1]:.6f}", flush=True)

    # DDP keeps the replicas identical: every rank must hold rank 0's weights.
    weight = model.module.weight.detach().clone()
    reference = weight.clone()
    dist.broadcast(reference, src=0)
    assert torch.allclose(weight, reference), "replicas diverged"
    if rank == 0:
        print(f"loss_first {losses[0]:.6f}", flush=True)
        print(f"loss_last {losses[-1]:.6f}", flush=True)
    # Every rank is done communicating before any tears its process group down (rank 0 hosts the
    # rendezvous store), as torch's docs advise.
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    # Debian's torch 1.13 can deadlock when DDP's model is freed, about once in 30 runs under
    # load: freeing its reducer on this thread, which holds the GIL, joins gloo's worker thread,
    # and that thread waits for the GIL to free a tensor (both stacks seen with gdb; the process
    # spins forever). Everything is printed, so leave before the model is freed.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
