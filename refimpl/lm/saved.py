"""A saved run: its checkpoint's state checked (``load_run_state``) and restored into a trainer
(``restore_trainer``), its policy reused to start RL (``init_policy``, ``--init-from``), evaluated
(``evaluate_checkpoint``, ``refimpl eval``) or sampled (``sample_checkpoint``, ``refimpl sample``).
Every failure is a one-line ``ValueError`` naming the file."""

from __future__ import annotations

import dataclasses

import torch

from refimpl.lm.checkpoint import check_model_config, load_checkpoint
from refimpl.lm.rollout import generate
from refimpl.lm.tasks import EOS, PAD, decode
from refimpl.lm.train import TrainConfig, Trainer

__all__ = [
    "first_line",
    "load_run_state",
    "restore_trainer",
    "init_policy",
    "evaluate_checkpoint",
    "sample_checkpoint",
]

# what a checkpoint's run state must hold, and the type of each entry
_STATE_TYPES = {
    "config": dict,
    "model_config": dict,
    "model": dict,
    "optimizer": dict,
    "phase": str,
    "step": int,
    "sft_step": int,
    "rng": list,
    "rng_split": int,
    "torch_rng": torch.Tensor,
    "last_eval": dict,
    "warmup_eval": dict,
    "run_id": str,
}
# entries a checkpoint holds when written by a version that stores them
_OPTIONAL_TYPES = {"device": str, "elapsed": dict}


def load_run_state(path) -> tuple[dict, TrainConfig]:
    """A checkpoint's run state and its config, checked: every entry present with its type, and
    the config valid. Errors are one-line ``ValueError``s naming the file."""
    state = load_checkpoint(path)
    optional = {key: kind for key, kind in _OPTIONAL_TYPES.items() if key in state}
    for key, kind in {**_STATE_TYPES, **optional}.items():
        if not isinstance(state.get(key), kind):
            found = type(state.get(key)).__name__ if key in state else "nothing"
            raise ValueError(
                f"checkpoint: {path} holds a malformed run state ({key}: expected {kind.__name__}, "
                f"found {found})"
            )
    clocks = state.get("elapsed", {"wall_time": 0.0, "cpu_time": 0.0})
    if set(clocks) != {"wall_time", "cpu_time"} or not all(
        isinstance(v, float) and v >= 0 for v in clocks.values()
    ):
        raise ValueError(f"checkpoint: {path} holds a malformed run state (elapsed: {clocks!r})")
    try:
        config = TrainConfig(**state["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint: {path} holds an invalid config ({first_line(err)})") from None
    return state, config


def restore_trainer(trainer: Trainer, state: dict, path, rng: bool = True) -> None:
    """``trainer.load_state_dict(state, rng)`` with every failure (missing weights, wrong shapes, a
    broken optimizer state) a one-line ``ValueError`` naming the file. ``rng=False``: evaluate or
    sample it on any device (the run's random streams are not restored)."""
    try:
        trainer.load_state_dict(state, rng=rng)
    except ValueError as err:
        if str(err).startswith("checkpoint:"):
            raise
        raise ValueError(f"checkpoint: {path} holds a malformed run state ({first_line(err)})") from None
    except (KeyError, TypeError, RuntimeError, IndexError, AttributeError) as err:
        raise ValueError(
            f"checkpoint: {path} holds a malformed run state ({type(err).__name__}: {first_line(err)})"
        ) from None


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def evaluate_checkpoint(path, device: str = "auto") -> dict:
    """Held-out greedy and sampled accuracy of the policy in a checkpoint."""
    state, config = load_run_state(path)
    config = dataclasses.replace(config, device=device)
    trainer = Trainer(config)
    restore_trainer(trainer, state, path, rng=False)
    result = trainer.evaluate()
    result.update(phase=trainer.phase, step=trainer.step, warmup_steps=trainer.sft_step, task=config.task)
    return result


def init_policy(trainer: Trainer, state: dict, path) -> None:
    """Start RL from the policy weights of a checkpoint (e.g. a saved warm-up), so several presets
    start from the same policy: the warm-up is marked done, the reference is this policy, the
    optimizer and random streams are this run's own. A value head (PPO-RLHF) absent from the
    checkpoint keeps its fresh initialisation."""
    saved = {k: v for k, v in state["model_config"].items() if k != "value_head"}
    expected = {k: v for k, v in trainer.model_config.to_dict().items() if k != "value_head"}
    check_model_config(saved, expected, path)
    weights = {k: v for k, v in state["model"].items() if not k.startswith("value.")}
    try:
        missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise ValueError(f"checkpoint: {path} holds malformed weights ({first_line(err)})") from None
    if unexpected or any(not k.startswith("value.") for k in missing):
        raise ValueError(f"checkpoint: {path} holds other weights (missing {missing}, extra {unexpected})")
    trainer.sft_step = int(state["sft_step"])
    trainer.evaluate()
    trainer.finish_warmup()


def sample_checkpoint(path, n: int = 8, seed: int = 0, device: str = "auto") -> list[str]:
    """Lines showing ``n`` held-out prompts with one sampled answer each (at the run's
    temperature / top-k), the target and the reward."""
    if n < 1:
        raise ValueError(f"--n: expected a positive integer, got {n}")
    state, config = load_run_state(path)
    trainer = Trainer(dataclasses.replace(config, device=device))
    restore_trainer(trainer, state, path, rng=False)
    problems = trainer.eval_set.index(torch.arange(min(n, len(trainer.eval_set)), device=trainer.device))
    trainer.model.eval()
    with torch.no_grad():
        ro = generate(
            trainer.model,
            problems.prompts,
            max_new_tokens=config.max_new_tokens,
            eos=EOS,
            pad=PAD,
            temperature=config.temperature,
            top_k=config.top_k,
            generator=torch.Generator(trainer.device).manual_seed(seed),
        )
    rewards = trainer.task.rewards(ro.responses, ro.lengths, problems, kind=config.reward)
    where = f"{trainer.phase} step {trainer.step if trainer.phase == 'rl' else trainer.sft_step}"
    lines = [f"{path}: {config.task}, loss {config.loss}, {where}, reward {config.reward}"]
    for i in range(len(problems)):
        prompt = decode(problems.prompts[i])
        answer = decode(ro.responses[i, : int(ro.lengths[i])])
        target = decode(problems.targets[i, : int(problems.target_lengths[i])])
        lines.append(f"{prompt!r:>14} -> {answer!r:<12} target {target!r:<10} reward {float(rewards[i]):.2f}")
    return lines
