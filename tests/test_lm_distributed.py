"""Two-process data parallelism (gloo, torch.multiprocessing spawn): the trainer's DDP gradient
equals the single-process full-batch gradient to 1e-6 relative, with ranks holding different
numbers of micro-batches (even none) and no deadlock; training calls the DDP wrapper; Magistral's
minibatch std is all-reduced (the same on every rank). ``check_two_ranks`` runs the same check with
NCCL on two GPUs (tests/test_cuda.py)."""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from refimpl.lm.train import TrainConfig, Trainer

pytestmark = pytest.mark.distributed

CASES = [  # (loss, kl_coef, sequences of rank 0 out of 20)
    ("grpo", 0.1, 13),  # 5 micro-batches of 3 on rank 0, 3 on rank 1
    ("dapo", None, 20),  # rank 1 has no sequence at all: it must still join the all-reduce
    ("dr_grpo", None, 7),
]


def _trainer(loss, kl_coef, device="cpu") -> Trainer:
    config = TrainConfig(
        device=device,
        amp=False,  # float32 on CUDA too: the gradients are compared to float32 roundoff
        loss=loss,
        kl_coef=kl_coef,
        n_layer=1,
        n_head=2,
        n_embd=16,
        prompts_per_step=5,
        group_size=4,
        micro_batch_size=3,
        eval_size=16,
        reward="partial",
        overlong_cache_len=0,
        dynamic_sampling=False,
    )
    trainer = Trainer(config)
    trainer.finish_warmup()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # identical on every rank; policy != reference so KL has a gradient
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))
    trainer.data_gen.manual_seed(11)  # the same batch on every rank (the trainer's are per rank)
    trainer.sample_gen.manual_seed(12)
    return trainer


def _gradient(trainer, batch, idx) -> torch.Tensor:
    trainer.model.zero_grad(set_to_none=True)
    trainer.accumulate_gradients(batch, idx)
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in trainer.model.parameters()
        ]
    )


def _magistral_values() -> torch.Tensor:
    return torch.randn(20, generator=torch.Generator().manual_seed(7))


def _worker(rank, world_size, init_file, out_dir, device_type="cpu"):
    torch.set_num_threads(1)
    device = "cpu"
    if device_type == "cuda":  # one GPU per rank
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        results = []
        for loss, kl_coef, split in CASES:
            trainer = _trainer(loss, kl_coef, device)
            calls = []
            trainer.ddp_model.register_forward_pre_hook(
                lambda module, args, calls=calls: calls.append(type(module).__name__)
            )
            batch = trainer.collect()
            assert len(batch) == 20
            idx = torch.arange(split) if rank == 0 else torch.arange(split, len(batch))
            results.append({"grad": _gradient(trainer, batch, idx.to(trainer.device)).cpu(), "calls": calls})
        # Magistral's minibatch std, the minibatch split unevenly over the ranks (even 20 / 0)
        from refimpl.lm import distributed as dist_lib
        from refimpl.lm.batch import minibatch_std_normalise

        values = _magistral_values()
        normalised = []
        for split in (13, 20):
            part = (values[:split] if rank == 0 else values[split:]).to(device)
            normalised.append(
                minibatch_std_normalise(part, dist_lib.all_reduce_sum, dist_lib.all_reduce_max).cpu()
            )
        torch.save({"cases": results, "magistral": normalised}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_rank_ddp_gradients_equal_the_full_batch_gradient(tmp_path):
    check_two_ranks(tmp_path, "cpu", rtol=1e-6)


def check_two_ranks(tmp_path, device_type: str, rtol: float) -> None:
    """Two ranks (gloo on the CPU, NCCL on two GPUs) against one process on ``device_type``:
    gradients to ``rtol`` of their norm."""
    context = mp.start_processes(
        _worker,
        args=(2, str(tmp_path / "init"), str(tmp_path), device_type),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 240
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail("distributed workers did not finish: deadlock")
    saved = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    ranks = [r["cases"] for r in saved]
    # Magistral: every rank divides by the std of the whole minibatch (all-reduced), so the two
    # halves are the single-process result (float32, 20 values: 1e-6 is ~10 unit roundoffs)
    from refimpl.lm.batch import minibatch_std_normalise

    whole = minibatch_std_normalise(_magistral_values())
    for case in range(2):
        torch.testing.assert_close(
            torch.cat([saved[0]["magistral"][case], saved[1]["magistral"][case]]), whole, rtol=1e-6, atol=1e-6
        )
    for case, (loss, kl_coef, split) in enumerate(CASES):
        trainer = _trainer(loss, kl_coef, device_type)
        batch = trainer.collect()
        trainer.config.micro_batch_size = len(batch)
        reference = _gradient(trainer, batch, torch.arange(len(batch), device=trainer.device)).cpu()
        assert reference.norm() > 0
        for rank in range(2):
            grad = ranks[rank][case]["grad"]
            assert (grad - reference).norm() <= rtol * reference.norm(), (loss, rank)
        # every training forward went through the DDP wrapper, one per micro-batch
        micro = [-(-split // 3), -(-(len(batch) - split) // 3)]
        for rank in range(2):
            expected = max(micro[rank], 1)  # a rank without data runs one zero-weight forward
            assert ranks[rank][case]["calls"] == ["DistributedDataParallel"] * expected
