"""Data-parallel helpers: ``torchrun``-compatible set-up (gloo on CPU, NCCL on CUDA) and the few
collectives the trainer needs. Without an initialised process group every helper is the identity
for one process, so the trainer runs unchanged on a laptop."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "is_distributed",
    "rank",
    "world_size",
    "init_from_env",
    "default_backend",
    "all_reduce_sum",
    "all_reduce_max",
    "all_gather_tensors",
    "training_handle",
]


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def default_backend(device: torch.device) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_from_env(device: torch.device) -> bool:
    """Initialise the process group from ``torchrun``'s environment (``WORLD_SIZE``, ``RANK``,
    ``MASTER_ADDR``...) when it describes more than one process. Returns whether it did. On CUDA,
    each rank uses the GPU ``LOCAL_RANK``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=default_backend(device))
    return True


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (a new tensor; ``x`` itself is left alone)."""
    out = x.clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of ``x`` over ranks (a new tensor)."""
    out = x.clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def all_gather_tensors(x: torch.Tensor) -> list[torch.Tensor]:
    """``x`` from every rank (same shape on all ranks), in rank order."""
    if not is_distributed():
        return [x]
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return out


def training_handle(model: torch.nn.Module, device: torch.device, compile: bool) -> torch.nn.Module:
    """``model`` as it trains: in ``DistributedDataParallel`` under an initialised process group
    (gradients synchronised), compiled with ``compile`` (a compiled module passes ``no_sync`` on
    to the wrapper). Without either, ``model`` itself."""
    handle = model
    if is_distributed():
        handle = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(handle) if compile else handle
