"""A tiny DDP training run for the docs (docs/distributed.md): two ranks on the CPU (gloo).

    gpuflame run -o ddp.pb.gz torchrun --standalone --nproc_per_node=2 examples/ddp_train.py

Every rank holds the same model, gradients, DDP's gradient buckets and AdamW's
state; rank 0 also keeps a copy of the weights on the side, as a rank that
writes checkpoints does, so the two ranks' peaks differ.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(32, 256)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def checkpoint(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def main() -> None:
    dist.init_process_group("gloo")
    model = DistributedDataParallel(build())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept = checkpoint(model.module) if dist.get_rank() == 0 else {}
    for _ in range(3):
        train_step(model, opt)
    dist.barrier()
    del kept
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
