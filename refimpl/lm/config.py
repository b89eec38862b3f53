"""The trainer's configuration: ``TrainConfig`` (every field a run depends on; a checkpoint stores
it), each field validated at construction by one rule table (``_FIELD_RULES``), and the names of
the trainable losses (the keys of ``refimpl.lm.recipes.RECIPES``)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field

import torch

from refimpl import losses
from refimpl.lm.recipes import RECIPES, ZERO_SIGNAL_MODES, resolve_recipe
from refimpl.lm.tasks import TASKS

__all__ = ["TrainConfig", "GROUP_PRESETS", "LOSS_NAMES", "LOSS_ALIASES", "check_device"]

# Losses trained with group advantages, and all of them; "ppo_rlhf" is PPO-RLHF (value head, GAE, KL
# in the reward), named so that it is not mistaken for the clipped loss preset
# ``refimpl.losses.get_preset("ppo")`` that it uses. "ppo" is its deprecated alias (checkpoints
# storing loss="ppo" still load).
GROUP_PRESETS: tuple[str, ...] = tuple(name for name, recipe in RECIPES.items() if not recipe.rlhf)
LOSS_NAMES: tuple[str, ...] = tuple(RECIPES)
LOSS_ALIASES: dict[str, str] = {"ppo": "ppo_rlhf"}  # deprecated name -> name


@dataclass
class TrainConfig:
    """Everything a run depends on (a checkpoint stores it). Defaults are the README main job."""

    task: str = "addition"
    loss: str = "dapo"
    seed: int = 0
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...
    # torch.compile the training forward pass and take the fused loss; off by default: on a CPU a
    # compiled step measured 0.89-0.94x an eager one (benchmarks/trainer.py --steps), 6-11 s over a
    # default run's ~200 RL steps, less than the cold compilation (tens of seconds), and the eager
    # policy_loss (its closed form) is as fast as the compiled loss (docs/results.md); CUDA unmeasured
    compile: bool = False
    amp: bool = True  # bfloat16 autocast on CUDA (ignored on CPU)
    # model (nanoGPT-like)
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    positions: str = "learned"
    # supervised warm-up
    sft_lr: float = 1e-3
    sft_batch_size: int = 64
    sft_max_steps: int = 3000
    sft_eval_every: int = 10
    sft_target_accuracy: float = 0.15  # held-out sampled accuracy that ends the warm-up
    # RL
    steps: int = 200
    prompts_per_step: int = 64
    group_size: int = 8
    inner_epochs: int = 2
    minibatches: int = 2  # optimizer steps per inner epoch
    micro_batch_size: int = 256  # sequences per forward/backward (gradient accumulation)
    lr: float = 5e-4
    lr_decay_steps: int = 200  # RL learning rate decays linearly over this many steps ...
    lr_min_fraction: float = 0.1  # ... to this fraction of lr (1.0 = constant)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 8  # > the longest answer (5) + DAPO's overlong cache (2)
    reward: str = "exact"  # "exact" or "partial"
    # None: the recipe's own (refimpl.lm.recipes.RECIPES, the one home of loss-dependent defaults)
    kl_coef: float | None = None
    kl_estimator: str | None = None  # "k1", "k2", "k3"
    entropy_coef: float | None = None
    eps_high: float | None = None  # the clip's upper bound 1 + eps_high (clip-higher, DAPO)
    aggregation: str | None = None  # the loss's aggregation (refimpl.losses.AGGREGATIONS)
    advantage_scale: str | None = None  # "group", "batch" (Magistral) or "none" (Dr. GRPO)
    dynamic_sampling: bool | None = None
    # groups with equal rewards: "resample" (= dynamic_sampling), "upweight" (filter, 1/(1 - f)), "keep"
    zero_signal: str | None = None
    max_sampling_rounds: int = 4
    overlong_cache_len: int | None = None  # DAPO's soft overlong penalty (0 = off)
    overlong_filter: bool = False
    ref_reset_every: int | None = None  # ProRL's reset of the reference and optimizer (0 = never)
    # PPO-RLHF
    value_coef: float = 0.5
    gamma: float = 1.0
    gae_lambda: float = 0.95
    rlhf_kl_coef: float = 0.02
    # evaluation and output
    eval_every: int = 10
    eval_size: int = 512
    eval_seed: int = 1234
    checkpoint_every: int = 20
    extra: dict = field(default_factory=dict)  # free-form notes stored with the run

    def __post_init__(self):
        """Every field checked here, before any work: one ``ValueError`` / ``TypeError`` naming the
        field (a bad value would otherwise fail late, or silently train something else)."""
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))
        if self.loss in LOSS_ALIASES:
            warnings.warn(
                f"loss: {self.loss!r} is a deprecated alias of {LOSS_ALIASES[self.loss]!r}",
                DeprecationWarning,
                stacklevel=3,
            )
            self.loss = LOSS_ALIASES[self.loss]
        if self.loss not in LOSS_NAMES:
            raise ValueError(f"loss: unknown loss {self.loss!r}; expected one of {list(LOSS_NAMES)}")
        if self.task not in TASKS:
            raise ValueError(f"task: unknown task {self.task!r}; expected one of {sorted(TASKS)}")
        if self.group_size < 2:
            raise ValueError(f"group_size: expected >= 2 (a group needs two samples), got {self.group_size}")
        cache_len = self.overlong_cache_len
        if cache_len is not None and cache_len > self.max_new_tokens:
            raise ValueError(
                f"overlong_cache_len: expected at most max_new_tokens={self.max_new_tokens}, got {cache_len}"
            )
        zero_signal, sampling = self.zero_signal, self.dynamic_sampling
        if zero_signal is not None and sampling is not None and sampling != (zero_signal == "resample"):
            raise ValueError(
                f"zero_signal: {zero_signal!r} contradicts dynamic_sampling={sampling} (give one of the two)"
            )
        if zero_signal == "upweight" and RECIPES[self.loss].rlhf:
            raise ValueError(f"zero_signal: 'upweight' needs group advantages; {self.loss} has none")
        if self.eps_high is not None or self.aggregation is not None:
            try:  # the loss variant with the overrides must itself be valid (e.g. dual_clip >= 1 + eps_high)
                resolve_recipe(self)
            except ValueError as err:
                names = [n for n in ("eps_high", "aggregation") if getattr(self, n) is not None]
                raise ValueError(f"{'/'.join(names)}: not valid for loss {self.loss!r} ({err})") from None
        check_device(self.device)

    @property
    def is_rlhf(self) -> bool:
        """PPO-RLHF (value head, KL in the reward, GAE)."""
        return RECIPES[self.loss].rlhf


def check_device(name: str) -> None:
    """``name`` is "auto" (CUDA when present) or a device torch knows ("cpu", "cuda", "cuda:N"):
    else a one-line ``ValueError`` naming ``device`` (torch's own message lists every device type
    it was built for)."""
    try:
        torch.device(name if name != "auto" else "cpu")
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}") from None


# Each field's kind and allowed values: (type, minimum, maximum, choices); None = no bound. A float
# field accepts an int; an int field refuses a bool; "?" marks fields where None means "the preset's".
_FIELD_RULES: dict[str, tuple] = {
    "task": (str, None, None, None),
    "loss": (str, None, None, None),
    "seed": (int, 0, None, None),
    "device": (str, None, None, None),
    "compile": (bool, None, None, None),
    "amp": (bool, None, None, None),
    "n_layer": (int, 1, None, None),
    "n_head": (int, 1, None, None),
    "n_embd": (int, 1, None, None),
    "positions": (str, None, None, ("learned", "rope")),
    "sft_lr": (float, 0.0, None, None),
    "sft_batch_size": (int, 1, None, None),
    "sft_max_steps": (int, 0, None, None),
    "sft_eval_every": (int, 1, None, None),
    "sft_target_accuracy": (float, 0.0, 1.0, None),
    "steps": (int, 0, None, None),
    "prompts_per_step": (int, 1, None, None),
    "group_size": (int, 2, None, None),
    "inner_epochs": (int, 1, None, None),
    "minibatches": (int, 1, None, None),
    "micro_batch_size": (int, 1, None, None),
    "lr": (float, 0.0, None, None),
    "lr_decay_steps": (int, 0, None, None),
    "lr_min_fraction": (float, 0.0, 1.0, None),
    "weight_decay": (float, 0.0, None, None),
    "grad_clip": (float, 0.0, None, None),
    "temperature": (float, 0.0, None, None),
    "top_k": (int, 0, None, None),
    "max_new_tokens": (int, 1, None, None),
    "reward": (str, None, None, ("exact", "partial")),
    "kl_coef": ("?", float, 0.0, None, None),
    "kl_estimator": ("?", str, None, None, losses.KL_ESTIMATORS),
    "entropy_coef": ("?", float, None, None, None),
    "eps_high": ("?", float, 0.0, None, None),
    "aggregation": ("?", str, None, None, losses.AGGREGATIONS),
    "advantage_scale": ("?", str, None, None, ("none", "group", "batch")),
    "dynamic_sampling": ("?", bool, None, None, None),
    "zero_signal": ("?", str, None, None, ZERO_SIGNAL_MODES),
    "max_sampling_rounds": (int, 1, None, None),
    "overlong_cache_len": ("?", int, 0, None, None),
    "overlong_filter": (bool, None, None, None),
    "ref_reset_every": ("?", int, 0, None, None),
    "value_coef": (float, 0.0, None, None),
    "gamma": (float, 0.0, 1.0, None),
    "gae_lambda": (float, 0.0, 1.0, None),
    "rlhf_kl_coef": (float, 0.0, None, None),
    "eval_every": (int, 1, None, None),
    "eval_size": (int, 1, None, None),
    "eval_seed": (int, 0, None, None),
    "checkpoint_every": (int, 1, None, None),
    "extra": (dict, None, None, None),
}
# strictly positive, not merely >= 0
_POSITIVE = {"sft_lr", "lr", "grad_clip", "temperature"}


def _check_field(name: str, value) -> None:
    """Type, finiteness, range and choices of one ``TrainConfig`` field (``_FIELD_RULES``)."""
    rule = _FIELD_RULES[name]
    if rule[0] == "?":
        if value is None:
            return
        rule = rule[1:]
    kind, low, high, choices = rule
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise TypeError(f"{name}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    if choices is not None and value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    if kind in (int, float):
        if not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite number, got {value}")
        if name in _POSITIVE and not value > 0:
            raise ValueError(f"{name}: expected > 0, got {value}")
        if low is not None and value < low:
            raise ValueError(f"{name}: expected >= {low}, got {value}")
        if high is not None and value > high:
            raise ValueError(f"{name}: expected <= {high}, got {value}")
