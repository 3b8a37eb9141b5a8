"""A tiny data-parallel training run: what a user's torchrun script does, scaled down.

Reads the gang's rendezvous from the environment gpufleet gives every task (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK), trains a linear model with DistributedDataParallel over gloo
(CPU), and prints the loss each epoch. Rank 0 prints "loss_first" and "loss_last" at the end.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")  # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
