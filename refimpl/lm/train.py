"""The tiny-LM trainer: a supervised warm-up, then RL with any verified policy-loss preset.

Follows the recipe of seed 001 section 5.3.2 (``refimpl.lm.run`` drives the phases):

1. **Warm-up** (``Trainer.sft_step_once``, repeated by ``run.warmup_phase``): next-token training
   on generated solutions until held-out *sampled* accuracy reaches ``sft_target_accuracy``, so
   RL starts from an imperfect policy whose groups carry signal.
2. **RL step** (``Trainer.rl_step``), repeated ``steps`` times:
   freeze the behaviour policy; draw prompts; sample ``group_size`` responses per prompt
   (``rollout.generate``); score them (``Task.rewards``, DAPO's soft overlong penalty); compute
   advantages (``refimpl.advantages.group_advantages``; token-level GAE for PPO-RLHF); with DAPO's
   dynamic sampling, keep drawing until enough groups have non-zero reward variance; recompute the
   old-policy and reference log-probs with the trainer's own forward pass; then ``inner_epochs``
   passes over ``minibatches`` optimizer steps, each accumulated over micro-batches of
   ``refimpl.losses.policy_loss``, with the aggregation's normaliser counted over the whole
   minibatch on every rank (all-reduce), so micro-batching and data parallelism give the gradient
   of the full batch.
3. **PPO-RLHF** (``loss="ppo_rlhf"``; ``"ppo"`` is a deprecated alias): a value head, the KL to
   the reference folded into the per-token reward (seed 001 (87)), token-level GAE
   (``refimpl.estimators.gae_advantages``, seed 001 (80)).

The KL regulariser is minimised (``loss = -objective + beta * KL``) and counted inside the same
global normaliser as the policy term (``policy_loss`` adds it before normalising).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
import uuid

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from refimpl import advantages as adv_lib
from refimpl import losses
from refimpl.estimators import gae_advantages
from refimpl.kl import kl_k3
from refimpl.lm import distributed as dist_lib
from refimpl.lm.batch import (  # re-exported
    RolloutBatch,
    _cat_rollouts,
    _finalise_metrics,
    _index_rollout,
    group_advantages_for,
    minibatch_std_normalise,
)
from refimpl.lm.config import GROUP_PRESETS, LOSS_NAMES, TrainConfig  # re-exported
from refimpl.lm.model import GPT, GPTConfig
from refimpl.lm.rlhf import kl_shaped_token_rewards, masked_whiten
from refimpl.lm.rollout import Rollout, generate, policy_logprobs, response_logits
from refimpl.lm.tasks import EOS, PAD, VOCAB, Problems, get_task

__all__ = [
    "TrainConfig",
    "RolloutBatch",
    "Trainer",
    "NonFiniteLossError",
    "resolve_device",
    "GROUP_PRESETS",
    "LOSS_NAMES",
]

class NonFiniteLossError(RuntimeError):
    """A NaN or infinite loss or gradient: training stops before the optimizer step and the last
    good checkpoint is kept."""


def resolve_device(name: str) -> torch.device:
    """``"auto"``: the first CUDA device when present, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available")
    if device.type == "cuda" and device.index is None:  # torchrun: the rank's LOCAL_RANK device
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Trainer:
    """Holds the model, reference model, optimizer, random generators and counters of one run.

    ``rank`` / ``world_size`` come from an initialised process group (``distributed``); the
    model is then wrapped in ``DistributedDataParallel`` and every forward pass that trains goes
    through the wrapper (``self.train_model``), so gradients are synchronised.
    """

    def __init__(self, config: TrainConfig):
        self.config = config
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
            value_head=config.is_rlhf,
        )
        self.model = GPT(self.model_config).to(self.device)
        self.ref_model: GPT | None = None
        self.train_model: torch.nn.Module = self.model
        if dist_lib.is_distributed():
            self.train_model = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.forward = torch.compile(self.train_model) if config.compile else self.train_model
        self.variant = self._loss_variant()
        # Data order differs per rank; sampling noise too. Both are saved for exact resume.
        self.data_gen = torch.Generator().manual_seed(config.seed * 1_000_003 + 17 * self.rank + 1)
        self.sample_gen = torch.Generator(self.device).manual_seed(
            config.seed * 1_000_003 + 17 * self.rank + 2
        )
        self.phase = "sft"
        self.sft_step = 0
        self.step = 0
        self.optimizer = self._new_optimizer(config.sft_lr)
        self.last_eval: dict = {}
        self.warmup_eval: dict = {}  # held-out accuracy when the warm-up ended
        self.run_id = uuid.uuid4().hex[:12]  # names the run in its metrics and checkpoints (rank 0's counts)

    # ------------------------------------------------------------------ set-up helpers

    def _loss_variant(self):
        c = self.config
        variant = losses.get_preset("ppo" if c.is_rlhf else c.loss)  # PPO-RLHF's clipped loss
        changes = {}
        if c.kl_coef is not None:
            changes["kl_coef"] = c.kl_coef
        if c.kl_estimator is not None:
            changes["kl_estimator"] = c.kl_estimator
        if c.entropy_coef is not None:
            changes["entropy_coef"] = c.entropy_coef
        if c.is_rlhf:  # PPO-RLHF puts the KL in the reward (001 (87)) with rlhf_kl_coef
            changes["kl_coef"] = 0.0
        if variant.aggregation == "seq_sum" and variant.max_length is None:
            changes["max_length"] = c.max_new_tokens  # Dr. GRPO's L_max: the generation limit
        return dataclasses.replace(variant, **changes) if changes else variant

    def _new_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=self.config.weight_decay
        )

    def _autocast(self):
        if self.device.type == "cuda" and self.config.amp:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def uses_reference(self) -> bool:
        return self.config.is_rlhf or self.variant.kl_coef > 0.0

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
            logits = response_logits(self.forward, problems.prompts, problems.targets)
        nll = F.cross_entropy(logits.float().transpose(1, 2), problems.targets, reduction="none")
        loss = (nll * mask).sum() / count * self.world_size  # DDP averages over ranks
        self._check_finite(loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.clip_finite_gradients()
        self.optimizer.step()
        self.sft_step += 1
        return {"phase": "sft", "sft_step": self.sft_step, "sft_loss": loss.item() / self.world_size}

    def warmup_done(self) -> bool:
        return self.phase != "sft"

    def finish_warmup(self) -> None:
        """Freeze the reference model and start RL with a fresh optimizer."""
        self.phase = "rl"
        self.warmup_eval = dict(self.last_eval)
        self.optimizer = self._new_optimizer(self.config.lr)
        if self.uses_reference:
            self.reset_reference()

    def reset_reference(self) -> None:
        """The reference becomes a frozen copy of the current policy (also ProRL's reset)."""
        self.ref_model = copy.deepcopy(self.model).eval()
        for p in self.ref_model.parameters():
            p.requires_grad_(False)

    # ------------------------------------------------------------------ rollouts

    @torch.no_grad()
    def _sample(self, problems: Problems) -> tuple[Rollout, torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        prompts = problems.prompts.repeat_interleave(c.group_size, dim=0)
        self.model.eval()
        with self._autocast():
            ro = generate(
                self.model,
                prompts,
                max_new_tokens=c.max_new_tokens,
                eos=EOS,
                pad=PAD,
                temperature=c.temperature,
                top_k=c.top_k,
                generator=self.sample_gen,
            )
        self.model.train()
        group_problems = problems.index(
            torch.arange(len(problems), device=self.device).repeat_interleave(c.group_size)
        )
        correct = self.task.rewards(ro.responses, ro.lengths, group_problems, kind="exact")
        rewards = (
            correct
            if c.reward == "exact"
            else self.task.rewards(ro.responses, ro.lengths, group_problems, kind="partial")
        )
        cache_len = c.resolved_overlong_cache_len()
        if cache_len > 0:
            rewards = rewards + adv_lib.overlong_penalty(ro.lengths, c.max_new_tokens, cache_len).to(
                rewards.dtype
            )
        group_ids = torch.arange(len(problems), device=self.device).repeat_interleave(c.group_size)
        return ro, rewards, correct, group_ids

    @torch.no_grad()
    def collect(self) -> RolloutBatch:
        """Prompts -> groups of samples -> rewards -> advantages, old and reference log-probs.
        With dynamic sampling, rounds of ``prompts_per_step`` prompts are drawn until that many
        groups with non-zero reward variance are kept (at most ``max_sampling_rounds``)."""
        c = self.config
        rounds = c.max_sampling_rounds if c.resolved_dynamic_sampling() else 1
        parts, kept_groups, drawn_groups, drawn_reward, drawn_correct = [], 0, 0, 0.0, 0.0
        for _ in range(rounds):
            problems = self.task.sample_problems(c.prompts_per_step, self.data_gen).to(self.device)
            ro, rewards, correct, group_ids = self._sample(problems)
            drawn_groups += c.prompts_per_step
            drawn_reward += float(rewards.sum())
            drawn_correct += float(correct.sum())
            if c.resolved_dynamic_sampling():
                keep = adv_lib.dynamic_sampling_mask(rewards, group_ids)
                idx = keep.nonzero().squeeze(1)[: (c.prompts_per_step - kept_groups) * c.group_size]
                ro = _index_rollout(ro, idx)
                rewards, correct, group_ids = rewards[idx], correct[idx], group_ids[idx] + drawn_groups
            parts.append((ro, rewards, correct, group_ids))
            kept_groups += rewards.shape[0] // c.group_size
            if kept_groups >= c.prompts_per_step:
                break
        ro = _cat_rollouts([p[0] for p in parts])
        rewards, correct, group_ids = (torch.cat([p[i] for p in parts]) for i in (1, 2, 3))
        mask = ro.mask.to(torch.float32)
        if c.overlong_filter:
            mask = adv_lib.overlong_filter_mask(mask, ro.truncated)
        old_logp, ref_logp, values = self._score(ro)
        returns = None
        if c.is_rlhf:
            advantages, returns = self._rlhf_advantages(ro, rewards, old_logp, ref_logp, values, mask)
        elif len(rewards):
            # Magistral ("batch"): centred here, divided by the std of each optimizer minibatch in update()
            scale = c.resolved_advantage_scale()
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
            old_logp,
            ro.logprobs,
            ref_logp,
            ro.topk_indices,
            returns,
            kept_fraction=kept_groups / max(drawn_groups, 1),
            drawn_reward=drawn_reward / (drawn_groups * c.group_size),
            drawn_accuracy=drawn_correct / (drawn_groups * c.group_size),
        )

    @torch.no_grad()
    def _score(self, ro: Rollout):
        """Old-policy (and reference) log-probs recomputed by the trainer's forward pass, in the
        micro-batch size the update uses, so on-policy ratios are 1 (001 (95))."""
        c = self.config
        old, ref, val = [], [], []
        for idx in torch.arange(ro.prompts.shape[0], device=self.device).split(c.micro_batch_size):
            prompts, responses = ro.prompts[idx], ro.responses[idx]
            topk = None if ro.topk_indices is None else ro.topk_indices[idx]
            with self._autocast():
                if c.is_rlhf:
                    full = torch.cat([prompts, responses], dim=1)
                    logits, values = self.model(full, return_values=True)
                    logits = logits[:, prompts.shape[1] - 1 : -1]
                    val.append(values[:, prompts.shape[1] - 1 :].float())  # V(s_0) .. V(s_L)
                else:
                    logits = response_logits(self.model, prompts, responses)
                old.append(policy_logprobs(logits, responses, c.temperature, topk)[0])
                if self.ref_model is not None:
                    ref_logits = response_logits(self.ref_model, prompts, responses)
                    ref.append(policy_logprobs(ref_logits, responses, c.temperature, topk)[0])
        empty = torch.zeros(0, c.max_new_tokens, device=self.device)
        old_logp = torch.cat(old) if old else empty
        ref_logp = (torch.cat(ref) if ref else empty) if self.ref_model is not None else None
        values = (
            (torch.cat(val) if val else torch.zeros(0, c.max_new_tokens + 1, device=self.device))
            if c.is_rlhf
            else None
        )
        return old_logp, ref_logp, values

    def _rlhf_advantages(self, ro, rewards, old_logp, ref_logp, values, mask):
        """PPO-RLHF: per-token reward ``-beta (log pi_old - log pi_ref)`` plus the sequence reward
        at the last sampled token (seed 001 (87)), then token-level GAE (001 (80)); advantages are
        whitened over the tokens of all ranks."""
        c = self.config
        token_rewards, last = kl_shaped_token_rewards(
            rewards, ro.lengths, old_logp, ref_logp, mask, c.rlhf_kl_coef
        )
        terminated = last & ~ro.truncated[:, None]
        truncated = last & ro.truncated[:, None]
        out = gae_advantages(
            token_rewards, values[:, :-1], values[:, 1:], terminated, truncated, c.gamma, c.gae_lambda
        )
        return masked_whiten(out.advantages, mask, dist_lib.all_reduce_sum), out.returns

    # ------------------------------------------------------------------ update

    def normalizer(self, batch: RolloutBatch, idx: torch.Tensor) -> torch.Tensor:
        """The preset's aggregation denominator over the sequences ``idx`` of this rank, summed
        over all ranks (the global count that makes micro-batching exact)."""
        return dist_lib.all_reduce_sum(losses.loss_normalizer(batch.mask[idx], self.variant))

    def micro_batch_loss(self, batch: RolloutBatch, idx: torch.Tensor, normalizer: torch.Tensor):
        """Loss of the sequences ``idx`` with the global ``normalizer`` (so summing micro-batch
        losses gives the minibatch loss), plus detached metrics. Runs through ``self.forward``
        (the DDP wrapper when distributed)."""
        c = self.config
        prompts, responses, mask = batch.prompts[idx], batch.responses[idx], batch.mask[idx]
        topk = None if batch.topk_indices is None else batch.topk_indices[idx]
        with self._autocast():
            if c.is_rlhf:
                logits, values = response_logits(self.forward, prompts, responses, return_values=True)
            else:
                logits = response_logits(self.forward, prompts, responses)
        logp, entropy = policy_logprobs(logits, responses, c.temperature, topk)
        loss, metrics = losses.policy_loss(
            logp,
            batch.old_logp[idx],
            batch.advantages[idx],
            mask,
            self.variant,
            ref_logp=None if batch.ref_logp is None or c.is_rlhf else batch.ref_logp[idx],
            entropy=entropy,
            normalizer=normalizer,
        )
        if c.is_rlhf:  # 1/2 (V - V_targ)^2, seed 001 (82)
            value, _ = losses.value_loss(values.float(), batch.returns[idx], mask, normalizer=normalizer)
            loss = loss + (c.value_coef * 0.5) * value
        metrics = {k: v for k, v in metrics.items()}
        metrics["entropy_sum"] = (entropy.detach() * mask).sum()
        if batch.ref_logp is not None:
            metrics["kl_sum"] = (kl_k3(logp.detach(), batch.ref_logp[idx], check_finite=False) * mask).sum()
        metrics["token_count"] = mask.sum()
        return loss, metrics

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
                self.forward,
                self.eval_set.prompts[:1],
                torch.full((1, 1), PAD, device=self.device),
                **({"return_values": True} if self.config.is_rlhf else {}),
            )
        zero = sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))) * 0.0
        zero.backward()

    def accumulate_gradients(self, batch: RolloutBatch, idx: torch.Tensor) -> tuple[dict, bool]:
        """Gradient of the loss over the sequences ``idx`` (all ranks' minibatches together),
        accumulated over micro-batches; DDP synchronises only on the last backward of each rank,
        and every rank runs exactly one synchronising backward, whatever its number of
        micro-batches. Returns (summed metrics, whether anything counted)."""
        normalizer = self.normalizer(batch, idx)
        if normalizer.item() == 0:  # the same on every rank: nothing to learn from
            return {}, False
        micro = [mb for mb in idx.split(self.config.micro_batch_size) if mb.numel()]
        sums: dict[str, torch.Tensor] = {}
        ddp = isinstance(self.train_model, DistributedDataParallel)
        # One collective per call, never one per micro-batch (ranks may differ in their count).
        total_loss = torch.zeros((), device=self.device)
        for i, mb in enumerate(micro):
            sync = not ddp or i == len(micro) - 1
            with contextlib.nullcontext() if sync else self.train_model.no_sync():
                loss, metrics = self.micro_batch_loss(batch, mb, normalizer)
                total_loss = total_loss + loss.detach()
                (loss * self.world_size).backward()  # DDP averages gradients over ranks
            metrics["loss"] = loss.detach()
            weight = mb.numel()
            for key, value in metrics.items():
                value = torch.as_tensor(value, dtype=torch.float32).detach().to(self.device)
                sums[key] = sums.get(key, 0.0) + (
                    value if key.endswith(("_sum", "count")) or key == "loss" else value * weight
                )
        if not micro and ddp:
            self._dummy_backward()
        self._check_finite(total_loss)  # before any optimizer step: the weights stay good
        sums["_sequences"] = torch.tensor(float(idx.numel()), device=self.device)
        return sums, True

    def update(self, batch: RolloutBatch) -> dict:
        """``inner_epochs`` x ``minibatches`` optimizer steps on ``batch``."""
        c = self.config
        totals: dict[str, float] = {}
        for _ in range(c.inner_epochs):
            order = torch.randperm(len(batch), generator=self.data_gen).to(self.device)
            bounds = [round(i * len(batch) / c.minibatches) for i in range(c.minibatches + 1)]
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                self.optimizer.zero_grad(set_to_none=True)
                minibatch = self._minibatch_normalised(batch, order[lo:hi])
                sums, counted = self.accumulate_gradients(minibatch, order[lo:hi])
                if not counted:
                    continue
                grad_norm = self.clip_finite_gradients()
                self.optimizer.step()
                sums["grad_norm"] = grad_norm.detach() * sums["_sequences"]
                sums["_optimizer_steps"] = torch.ones(())
                for key, value in sums.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
        return _finalise_metrics(totals)

    def _minibatch_normalised(self, batch: RolloutBatch, idx: torch.Tensor) -> RolloutBatch:
        """Magistral (``advantage_scale="batch"``, seed 002): the centred advantages of the
        minibatch ``idx`` (all ranks' together) divided by their std; ``batch`` itself for
        every other scale. Collective: every rank calls it for every minibatch."""
        if self.config.is_rlhf or self.config.resolved_advantage_scale() != "batch":
            return batch
        advantages = batch.advantages.clone()
        advantages[idx] = minibatch_std_normalise(
            batch.advantages[idx], dist_lib.all_reduce_sum, dist_lib.all_reduce_max
        )
        return dataclasses.replace(batch, advantages=advantages)

    def rl_learning_rate(self) -> float:
        """Linear decay from ``lr`` to ``lr * lr_min_fraction`` over ``lr_decay_steps`` steps, a
        function of the step counter only (so a resumed run follows the same schedule)."""
        c = self.config
        progress = min(self.step / max(c.lr_decay_steps, 1), 1.0)
        return c.lr * (1.0 - (1.0 - c.lr_min_fraction) * progress)

    def rl_step(self) -> dict:
        """One iteration of 001 5.3.2: collect, then update. Returns the step's metrics."""
        c = self.config
        if c.ref_reset_every and self.step > 0 and self.step % c.ref_reset_every == 0:
            self.reset_reference()
            self.optimizer = self._new_optimizer(c.lr)  # ProRL resets the optimizer state too
        for group in self.optimizer.param_groups:
            group["lr"] = self.rl_learning_rate()
        t0 = time.perf_counter()
        batch = self.collect()
        t1 = time.perf_counter()
        metrics = self.update(batch)
        t2 = time.perf_counter()
        self.step += 1
        tokens = float(batch.mask.sum()) if len(batch) else 0.0
        sampled_tokens = float(batch.lengths.sum()) * self.world_size
        metrics.update(
            phase="rl",
            step=self.step,
            reward=batch.drawn_reward,
            accuracy=batch.drawn_accuracy,
            response_length=float(batch.lengths.float().mean()) if len(batch) else float("nan"),
            kept_groups=batch.kept_fraction,
            lr=self.optimizer.param_groups[0]["lr"],
            rollout_tokens_per_s=sampled_tokens / max(t1 - t0, 1e-9),
            update_tokens_per_s=tokens * c.inner_epochs * self.world_size / max(t2 - t1, 1e-9),
        )
        return metrics

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything needed to continue identically (weights, optimizer, counters, random
        generators of every rank)."""
        rng = torch.cat([self.data_gen.get_state(), self.sample_gen.get_state().cpu()])
        rngs = [r.cpu() for r in dist_lib.all_gather_tensors(rng.to(self.device))]
        return {
            "config": {k: v for k, v in dataclasses.asdict(self.config).items()},
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
        }

    def load_state_dict(self, state: dict) -> None:
        from refimpl.lm.checkpoint import check_model_config

        check_model_config(state["model_config"], self.model_config.to_dict())
        if len(state["rng"]) != self.world_size:
            raise ValueError(
                f"checkpoint: saved by {len(state['rng'])} ranks, resumed with {self.world_size}; "
                "exact resume "
                "needs the same number of ranks"
            )
        self.model.load_state_dict(state["model"])
        self.phase, self.step, self.sft_step = state["phase"], int(state["step"]), int(state["sft_step"])
        if state["ref_model"] is not None:
            self.ref_model = copy.deepcopy(self.model).eval()
            self.ref_model.load_state_dict(state["ref_model"])
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = self._new_optimizer(self.config.lr if self.phase == "rl" else self.config.sft_lr)
        self.optimizer.load_state_dict(state["optimizer"])
        rng, split = state["rng"][self.rank], int(state["rng_split"])
        self.data_gen.set_state(rng[:split].clone())
        self.sample_gen.set_state(rng[split:].clone())
        torch.set_rng_state(state["torch_rng"])
        self.last_eval = dict(state["last_eval"])
        self.warmup_eval = dict(state["warmup_eval"])
        self.run_id = str(state["run_id"])
