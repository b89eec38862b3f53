"""The tiny-LM trainer: a supervised warm-up, then RL with any verified policy-loss preset.

Follows the recipe of Shao et al. 2024, Algorithm 1 (``refimpl.lm.run`` drives the phases):

1. **Warm-up** (``Trainer.sft_step_once``, repeated by ``run.warmup_phase``): next-token training
   on generated solutions until held-out *sampled* accuracy reaches ``sft_target_accuracy``, so
   RL starts from an imperfect policy whose groups carry signal.
2. **RL step** (``Trainer.rl_step``), repeated ``steps`` times: ``collect`` (prompts, groups of
   samples, rewards, DAPO's dynamic sampling, the old-policy and reference log-probs recomputed by
   the trainer's own forward pass, advantages: ``refimpl.lm.experience``), then ``update``:
   ``inner_epochs`` passes over ``minibatches`` optimizer steps, each accumulated over
   micro-batches of ``refimpl.losses.policy_loss``, with the aggregation's normaliser counted over
   the whole minibatch on every rank (all-reduce), so micro-batching and data parallelism give the
   gradient of the full batch.
3. What each ``loss`` name means (the policy-loss variant, advantage scale, dynamic sampling,
   PPO-RLHF's value head and KL-shaped reward, ProRL's resets) is its recipe,
   ``refimpl.lm.recipes.RECIPES``.

The KL regulariser is minimised (``loss = -objective + beta * KL``) and counted inside the same
global normaliser as the policy term (``policy_loss`` adds it before normalising).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid

import torch
import torch.nn.functional as F

from refimpl import advantages as adv_lib
from refimpl import losses
from refimpl.kl import kl_k3
from refimpl.lm import distributed as dist_lib
from refimpl.lm.batch import RolloutBatch, group_advantages_for, minibatch_std_normalise
from refimpl.lm.checkpoint import check_model_config
from refimpl.lm.config import GROUP_PRESETS, LOSS_NAMES, TrainConfig, check_device  # first three re-exported
from refimpl.lm.experience import autocast, draw_groups, rlhf_advantages, sample_groups, score
from refimpl.lm.metrics import StepSums, UpdateMetrics
from refimpl.lm.model import GPT, GPTConfig, frozen_copy
from refimpl.lm.recipes import resolve_recipe
from refimpl.lm.rollout import generate, policy_logprobs, response_logits
from refimpl.lm.tasks import EOS, PAD, VOCAB, get_task
from refimpl.losses.fused_policy import fused_policy_loss

__all__ = [
    "TrainConfig",
    "RolloutBatch",
    "Trainer",
    "NonFiniteLossError",
    "resolve_device",
    "auto_device",
    "GROUP_PRESETS",
    "LOSS_NAMES",
]


class NonFiniteLossError(RuntimeError):
    """A NaN or infinite loss or gradient: training stops before the optimizer step and the last
    good checkpoint is kept."""


def auto_device() -> str:
    """What ``device="auto"`` means: ``"cuda"`` when torch sees a CUDA device, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(name: str) -> torch.device:
    """The device named by ``name`` (``check_device``): ``"auto"`` is ``auto_device()``; a CUDA
    device without an index is the current one (the rank's own under torchrun)."""
    check_device(name)
    if name == "auto":
        name = auto_device()
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available")
    if device.type == "cuda" and device.index is None:  # torchrun: the rank's LOCAL_RANK device
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Trainer:
    """The state of one run: the policy, its frozen reference, the optimizer, the random generators
    and the step counters, with the warm-up step, the RL step and their parts as methods.

    One model, two handles: ``self.model`` is the policy (sampling, scoring, evaluation,
    checkpoints) and ``self.ddp_model`` the same module as it trains: wrapped in
    ``DistributedDataParallel`` when a process group is initialised (``distributed``), so gradients
    are synchronised, and compiled with ``compile``. Every forward pass that trains goes through
    ``self.ddp_model``.
    """

    def __init__(self, config: TrainConfig):
        self.config = config
        self.recipe = resolve_recipe(config)
        self.variant = self.recipe.variant  # the policy-loss parts
        self.device = resolve_device(config.device)
        self.rank, self.world_size = dist_lib.rank(), dist_lib.world_size()
        self.task = get_task(config.task, eval_size=config.eval_size, eval_seed=config.eval_seed)
        self.eval_set = self.task.eval_problems().to(self.device)
        torch.manual_seed(config.seed)  # the model's initialisation; identical on every rank
        self.model_config = GPTConfig(
            vocab_size=len(VOCAB),
            block_size=self.task.prompt_len + config.max_new_tokens,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            positions=config.positions,
            value_head=self.recipe.rlhf,
        )
        self.model = GPT(self.model_config).to(self.device)
        self.ddp_model = dist_lib.training_handle(self.model, self.device, config.compile)
        self.ref_model: GPT | None = None
        # Data order differs per rank; sampling noise too. Both are saved for exact resume.
        self.data_gen = torch.Generator().manual_seed(config.seed * 1_000_003 + 17 * self.rank + 1)
        self.sample_gen = torch.Generator(self.device).manual_seed(
            config.seed * 1_000_003 + 17 * self.rank + 2
        )
        self.phase, self.sft_step, self.step = "sft", 0, 0
        self.optimizer = self._new_optimizer(config.sft_lr)
        self.last_eval: dict = {}
        self.warmup_eval: dict = {}  # held-out accuracy when the warm-up ended
        self.run_id = uuid.uuid4().hex[:12]  # names the run in its metrics and checkpoints (rank 0's counts)

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=self.config.weight_decay
        )

    def _autocast(self):
        return autocast(self.device, self.config.amp)

    @property
    def uses_reference(self) -> bool:
        return self.recipe.rlhf or self.variant.kl_coef > 0.0

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out accuracy, greedy and sampled (at the training temperature / top-k). Sampling
        uses its own generator seeded from ``eval_seed``, so evaluating never changes the training
        random streams (exact resume) and every evaluation sees the same noise."""
        c = self.config
        self.model.eval()
        prompts = self.eval_set.prompts
        kwargs = dict(
            max_new_tokens=c.max_new_tokens, eos=EOS, pad=PAD, temperature=c.temperature, top_k=c.top_k
        )
        with self._autocast():
            greedy = generate(self.model, prompts, greedy=True, **kwargs)
            gen = torch.Generator(self.device).manual_seed(c.eval_seed)
            sampled = generate(self.model, prompts, generator=gen, **kwargs)
        self.model.train()
        acc = {}
        for name, ro in (("greedy", greedy), ("sampled", sampled)):
            acc[f"eval_{name}_accuracy"] = (
                self.task.rewards(ro.responses, ro.lengths, self.eval_set).mean().item()
            )
        self.last_eval = acc
        return acc

    # ------------------------------------------------------------------ supervised warm-up

    def sft_step_once(self) -> dict:
        """One next-token step on generated solutions (answer tokens and EOS count; the token
        mean is over all ranks' answer tokens)."""
        problems = self.task.sample_problems(self.config.sft_batch_size, self.data_gen).to(self.device)
        mask = (
            torch.arange(problems.targets.shape[1], device=self.device)[None, :]
            < problems.target_lengths[:, None]
        )
        count = dist_lib.all_reduce_sum(mask.sum().to(torch.float32))
        with self._autocast():
            logits = response_logits(self.ddp_model, problems.prompts, problems.targets)
        nll = F.cross_entropy(logits.float().transpose(1, 2), problems.targets, reduction="none")
        loss = (nll * mask).sum() / count * self.world_size  # DDP averages over ranks
        self._check_finite(loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.clip_finite_gradients()
        self.optimizer.step()
        self.sft_step += 1
        return {"phase": "sft", "sft_step": self.sft_step, "sft_loss": loss.item() / self.world_size}

    def finish_warmup(self) -> None:
        """Freeze the reference model and start RL with a fresh optimizer."""
        self.phase = "rl"
        self.warmup_eval = dict(self.last_eval)
        self.optimizer = self._new_optimizer(self.config.lr)
        if self.uses_reference:
            self.reset_reference()

    def reset_reference(self) -> None:
        """The reference becomes a frozen copy of the current policy."""
        self.ref_model = frozen_copy(self.model)

    # ------------------------------------------------------------------ the RL step

    def rl_step(self) -> dict:
        """One iteration of Shao et al. 2024, Algorithm 1: (ProRL's periodic reset,) collect, then update.
        Returns the step's metrics."""
        reset_every = self.recipe.ref_reset_every
        if reset_every and self.step > 0 and self.step % reset_every == 0:
            self.reset_reference()
            self.optimizer = self._new_optimizer(self.config.lr)  # ProRL resets the optimizer state too
        for group in self.optimizer.param_groups:
            group["lr"] = self.rl_learning_rate()
        t0 = time.perf_counter()
        batch = self.collect()
        t1 = time.perf_counter()
        metrics = self.update(batch)
        t2 = time.perf_counter()
        self.step += 1
        metrics.update(self._step_record(batch, rollout_s=t1 - t0, update_s=t2 - t1))
        return metrics

    def rl_learning_rate(self) -> float:
        """Linear decay from ``lr`` to ``lr * lr_min_fraction`` over ``lr_decay_steps`` steps, a
        function of the step counter only (so a resumed run follows the same schedule)."""
        c = self.config
        progress = min(self.step / max(c.lr_decay_steps, 1), 1.0)
        return c.lr * (1.0 - (1.0 - c.lr_min_fraction) * progress)

    def _step_record(self, batch: RolloutBatch, rollout_s: float, update_s: float) -> dict:
        """The RL step's metrics besides the update's: the samples drawn, the learning rate, speed."""
        tokens = float(batch.mask.sum()) if len(batch) else 0.0
        sampled_tokens = float(batch.lengths.sum()) * self.world_size
        return dict(
            phase="rl",
            step=self.step,
            reward=batch.drawn_reward,
            accuracy=batch.drawn_accuracy,
            response_length=float(batch.lengths.float().mean()) if len(batch) else float("nan"),
            # sampled responses (every one drawn) that hit max_new_tokens without EOS
            truncation_rate=batch.drawn_truncation,
            kept_groups=batch.kept_fraction,
            lr=self.optimizer.param_groups[0]["lr"],
            rollout_tokens_per_s=sampled_tokens / max(rollout_s, 1e-9),
            update_tokens_per_s=tokens * self.config.inner_epochs * self.world_size / max(update_s, 1e-9),
        )

    @torch.no_grad()
    def collect(self) -> RolloutBatch:
        """Prompts -> groups of samples -> rewards (with dynamic sampling, rounds until enough
        groups have signal: ``experience.draw_groups``) -> old and reference log-probs ->
        advantages."""
        c = self.config

        def draw():
            problems = self.task.sample_problems(c.prompts_per_step, self.data_gen).to(self.device)
            return sample_groups(self.model, self.task, problems, c, self.recipe, self.sample_gen)

        drawn = draw_groups(draw, c, self.recipe)
        ro, rewards, correct, group_ids = drawn.groups
        mask = ro.mask.to(torch.float32)
        if c.overlong_filter:
            mask = adv_lib.overlong_filter_mask(mask, ro.truncated)
        keep, kept_rows, rows, kept_fraction = None, 0, 0, drawn.kept_fraction
        if self.recipe.upweight_zero_signal:
            keep, kept_rows, rows = self._zero_signal_filter(rewards, group_ids, mask)
            kept_fraction = float(keep.float().mean()) if len(keep) else 1.0
        scores = score(self.model, self.ref_model, ro, c, self.recipe.rlhf)
        returns = None
        if self.recipe.rlhf:
            advantages, returns = rlhf_advantages(ro, rewards, scores, mask, c)
        elif len(rewards):
            # Magistral ("batch"): centred here, divided by the std of each optimizer minibatch in update()
            scale = self.recipe.advantage_scale
            advantages = group_advantages_for(rewards, group_ids, "none" if scale == "batch" else scale)
        else:
            advantages = rewards.clone()
        return RolloutBatch(
            ro.prompts,
            ro.responses,
            mask,
            ro.lengths,
            ro.truncated,
            rewards,
            correct,
            group_ids,
            advantages,
            scores.old_logp,
            ro.logprobs,
            scores.ref_logp,
            ro.topk_indices,
            returns,
            kept_fraction=kept_fraction,
            drawn_reward=drawn.reward,
            drawn_accuracy=drawn.accuracy,
            drawn_truncation=drawn.truncation,
            keep=keep,
            kept_rows=kept_rows,
            rows=rows,
        )

    @staticmethod
    def _zero_signal_filter(rewards, group_ids, mask) -> tuple[torch.Tensor, int, int]:
        """Dynamic sampling's alternative (``zero_signal="upweight"``, an alternative to DAPO's oversampling;
        advantages.md eq. (16)): the samples of groups with signal (``dynamic_sampling_mask``), and
        the step's counts over all ranks of the non-empty rows of ``mask`` kept and in all, so that
        ``1 - f = kept / rows`` (``refimpl.losses.upweighted_normalizer``'s f). Collective."""
        keep = adv_lib.dynamic_sampling_mask(rewards, group_ids)
        nonempty = mask.bool().any(dim=-1)
        counts = torch.stack([(nonempty & keep).sum(), nonempty.sum()]).to(torch.float64)
        kept_rows, rows = (int(v) for v in dist_lib.all_reduce_sum(counts).tolist())
        return keep, kept_rows, rows

    def update(self, batch: RolloutBatch) -> dict:
        """``inner_epochs`` x ``minibatches`` optimizer steps on ``batch``; the update's metrics."""
        c = self.config
        metrics = UpdateMetrics()
        for _ in range(c.inner_epochs):
            order = torch.randperm(len(batch), generator=self.data_gen).to(self.device)
            bounds = [round(i * len(batch) / c.minibatches) for i in range(c.minibatches + 1)]
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                self.optimizer.zero_grad(set_to_none=True)
                minibatch = self._minibatch_normalised(batch, order[lo:hi])
                sums = self.accumulate_gradients(minibatch, order[lo:hi])
                if sums is None:
                    continue
                grad_norm = self.clip_finite_gradients()
                self.optimizer.step()
                metrics.add_step(sums, grad_norm)
        return metrics.record()

    def _minibatch_normalised(self, batch: RolloutBatch, idx: torch.Tensor) -> RolloutBatch:
        """Magistral (``advantage_scale="batch"``, Mistral AI 2025): the centred advantages of the
        minibatch ``idx`` (all ranks' together) divided by their std; ``batch`` itself for
        every other scale. Collective: every rank calls it for every minibatch."""
        if self.recipe.rlhf or self.recipe.advantage_scale != "batch":
            return batch
        advantages = batch.advantages.clone()
        advantages[idx] = minibatch_std_normalise(
            batch.advantages[idx], dist_lib.all_reduce_sum, dist_lib.all_reduce_max
        )
        return dataclasses.replace(batch, advantages=advantages)

    # ------------------------------------------------------------------ gradients

    def accumulate_gradients(self, batch: RolloutBatch, idx: torch.Tensor) -> StepSums | None:
        """Gradient of the loss over the sequences ``idx`` (all ranks' minibatches together),
        accumulated over micro-batches; DDP synchronises only on the last backward of each rank,
        and every rank runs exactly one synchronising backward, whatever its number of
        micro-batches. Returns the step's summed metrics, or None when no token counts (on any
        rank: nothing to learn from)."""
        # the preset's aggregation denominator summed over all ranks: micro-batching stays exact
        normalizer = dist_lib.all_reduce_sum(losses.loss_normalizer(batch.mask[idx], self.variant))
        if batch.keep is not None and batch.kept_rows > 0:
            # zero_signal="upweight": (1 - f) x the unfiltered denominator, f the step's filtered share
            # (as refimpl.losses.upweighted_normalizer; with f = 1 the loss is 0 and D stays)
            normalizer = normalizer.to(torch.float64) * batch.kept_rows / batch.rows
        if normalizer.item() == 0:  # the same on every rank
            return None
        micro = [mb for mb in idx.split(self.config.micro_batch_size) if mb.numel()]
        sums = StepSums()
        distributed = dist_lib.is_distributed()
        # One collective per call, never one per micro-batch (ranks may differ in their count).
        for i, mb in enumerate(micro):
            sync = not distributed or i == len(micro) - 1
            with contextlib.nullcontext() if sync else self.ddp_model.no_sync():
                loss, micro_sums = self.micro_batch_loss(batch, mb, normalizer)
                (loss * self.world_size).backward()  # DDP averages gradients over ranks
            sums.add(micro_sums)
        if not micro and distributed:
            self._dummy_backward()
        self._check_finite(torch.as_tensor(sums.loss, device=self.device))  # before any optimizer step
        return sums

    def micro_batch_loss(self, batch: RolloutBatch, idx: torch.Tensor, normalizer: torch.Tensor):
        """Loss of the sequences ``idx`` with the global ``normalizer`` (so summing micro-batch
        losses gives the minibatch loss), through ``self.ddp_model``; and its ``StepSums``."""
        c, rlhf = self.config, self.recipe.rlhf
        prompts, responses, mask = batch.prompts[idx], batch.responses[idx], batch.mask[idx]
        if batch.keep is not None:  # zero_signal="upweight": the zero-signal groups' rows do not count
            mask = mask * batch.keep[idx, None].to(mask.dtype)
        topk = None if batch.topk_indices is None else batch.topk_indices[idx]
        with self._autocast():
            out = response_logits(self.ddp_model, prompts, responses, return_values=rlhf)
        logits, values = out if rlhf else (out, None)
        logp, entropy = policy_logprobs(logits, responses, c.temperature, topk)
        ref_logp = None if batch.ref_logp is None else batch.ref_logp[idx]
        # compiled runs take the fused fast path (the same loss); uncompiled, the eager reference is faster
        policy_loss = fused_policy_loss if c.compile else losses.policy_loss
        loss, diagnostics = policy_loss(
            logp,
            batch.old_logp[idx],
            batch.advantages[idx],
            mask,
            self.variant,
            ref_logp=None if rlhf else ref_logp,  # PPO-RLHF's KL is in the reward
            entropy=entropy,
            normalizer=normalizer,
        )
        if rlhf:  # 1/2 (V - V_targ)^2 (Schulman et al. 2017, eq. (9), with a factor 1/2)
            value, _ = losses.value_loss(values.float(), batch.returns[idx], mask, normalizer=normalizer)
            loss = loss + (c.value_coef * 0.5) * value
        kl = None if ref_logp is None else kl_k3(logp.detach(), ref_logp, check_finite=False)
        return loss, StepSums.micro_batch(loss, diagnostics, entropy, kl, mask)

    def _check_finite(self, loss: torch.Tensor) -> None:
        bad = dist_lib.all_reduce_max((~torch.isfinite(loss.detach())).to(torch.float32))
        if bad.item() > 0:
            raise NonFiniteLossError(
                f"non-finite loss ({loss.item()}) at phase {self.phase}, RL step {self.step + 1}, "
                f"warm-up step {self.sft_step}: training stopped; the last good checkpoint is kept"
            )

    def clip_finite_gradients(self) -> torch.Tensor:
        """The gradient's total norm, checked finite on every rank before it is clipped to
        ``grad_clip`` (the same arithmetic as ``clip_grad_norm_``). A NaN or infinite gradient
        raises ``NonFiniteLossError`` before any optimizer step, so the weights, the optimizer
        moments and the last checkpoint stay good."""
        params = list(self.model.parameters())
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        bad = dist_lib.all_reduce_max((~torch.isfinite(norm)).to(torch.float32))
        if bad.item() > 0:
            raise NonFiniteLossError(
                f"non-finite gradient (norm {norm.item()}) at phase {self.phase}, RL step {self.step + 1}, "
                f"warm-up step {self.sft_step}: training stopped; the last good checkpoint is kept"
            )
        torch.nn.utils.clip_grads_with_norm_(params, self.config.grad_clip, norm)  # takes parameters
        return norm

    def _dummy_backward(self) -> None:
        """A rank without micro-batches still joins the gradient all-reduce (zero gradient)."""
        with self._autocast():
            out = response_logits(
                self.ddp_model,
                self.eval_set.prompts[:1],
                torch.full((1, 1), PAD, device=self.device),
                return_values=self.recipe.rlhf,
            )
        zero = sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))) * 0.0
        zero.backward()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything needed to continue identically (weights, optimizer, counters, random
        generators of every rank)."""
        rng = torch.cat([self.data_gen.get_state(), self.sample_gen.get_state().cpu()])
        rngs = [r.cpu() for r in dist_lib.all_gather_tensors(rng.to(self.device))]
        return {
            "config": dataclasses.asdict(self.config),
            "model_config": self.model_config.to_dict(),
            "model": self.model.state_dict(),
            "ref_model": None if self.ref_model is None else self.ref_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "phase": self.phase,
            "step": self.step,
            "sft_step": self.sft_step,
            "rng": rngs,
            "rng_split": int(self.data_gen.get_state().numel()),
            "torch_rng": torch.get_rng_state(),
            "last_eval": dict(self.last_eval),
            "warmup_eval": dict(self.warmup_eval),
            "run_id": self.run_id,
            "device": str(self.device),
        }

    def load_state_dict(self, state: dict, rng: bool = True) -> None:
        """Continue from ``state_dict()``'s output (the same number of ranks, and a device of the
        type that sampled: a CUDA generator's state is not a CPU one's). ``rng=False``: the
        weights, optimizer and counters only, on any device (evaluating or sampling a checkpoint);
        the random streams are left alone."""
        check_model_config(state["model_config"], self.model_config.to_dict())
        if rng and len(state["rng"]) != self.world_size:
            raise ValueError(
                f"checkpoint: saved by {len(state['rng'])} ranks, resumed with {self.world_size}; "
                "exact resume needs the same number of ranks"
            )
        split = int(state["rng_split"])
        if rng and state["rng"][self.rank][split:].numel() != self.sample_gen.get_state().numel():
            raise ValueError(
                f"checkpoint: its sampling generator ran on {state.get('device', 'another device type')}, "
                f"this run on {self.device}; exact resume needs the device type it was saved on"
            )
        self.model.load_state_dict(state["model"])
        self.phase, self.step, self.sft_step = state["phase"], int(state["step"]), int(state["sft_step"])
        if state["ref_model"] is not None:
            self.ref_model = frozen_copy(self.model)
            self.ref_model.load_state_dict(state["ref_model"])
        self.optimizer = self._new_optimizer(self.config.lr if self.phase == "rl" else self.config.sft_lr)
        self.optimizer.load_state_dict(state["optimizer"])
        if rng:
            streams = state["rng"][self.rank]
            self.data_gen.set_state(streams[:split].clone())
            self.sample_gen.set_state(streams[split:].clone())
            torch.set_rng_state(state["torch_rng"])
        self.last_eval = dict(state["last_eval"])
        self.warmup_eval = dict(state["warmup_eval"])
        self.run_id = str(state["run_id"])

