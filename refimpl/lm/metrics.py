"""The RL update's metrics: sums over the micro-batches of one optimizer step (``StepSums``, float32
tensors on the device, read once per step) and over the optimizer steps of one update
(``UpdateMetrics``, Python floats), reduced to one record per RL step.

Token quantities (entropy, KL to the reference) are token means over the whole update; the policy
loss's own diagnostics (``refimpl.losses.policy_loss``: ratios, clip fraction...) and the gradient
norm are weighted by the sequences they cover; the loss is the mean over optimizer steps of each
step's loss (the sum of its micro-batch losses, which share one global normaliser).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["StepSums", "UpdateMetrics"]


@dataclass
class StepSums:
    """Sums over micro-batches of one optimizer step (float32 tensors, no host sync).
    ``diagnostics``: each ``policy_loss`` diagnostic times the micro-batch's sequences."""

    sequences: int = 0
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)
    entropy: torch.Tensor | float = 0.0  # summed over counted tokens
    kl: torch.Tensor | float | None = None  # k3 KL to the reference, summed over counted tokens
    tokens: torch.Tensor | float = 0.0
    loss: torch.Tensor | float = 0.0  # the step's loss: its micro-batch losses summed

    @classmethod
    def micro_batch(cls, loss, diagnostics: dict, entropy, kl, mask) -> StepSums:
        """One micro-batch: its ``loss``, the loss's ``diagnostics``, per-token ``entropy`` and
        ``kl`` (None without a reference) ``[n, L]`` and the float ``mask [n, L]``."""
        n = mask.shape[0]
        return cls(
            sequences=n,
            diagnostics={
                name: torch.as_tensor(value, dtype=torch.float32, device=loss.device).detach() * n
                for name, value in diagnostics.items()
            },
            entropy=(entropy.detach() * mask).sum(),
            kl=None if kl is None else (kl * mask).sum(),
            tokens=mask.sum(),
            loss=loss.detach().to(torch.float32),
        )

    def add(self, other: StepSums) -> None:
        """Add ``other``'s sums to these."""
        self.sequences += other.sequences
        for name, value in other.diagnostics.items():
            self.diagnostics[name] = self.diagnostics.get(name, 0.0) + value
        self.entropy = self.entropy + other.entropy
        if other.kl is not None:
            self.kl = (0.0 if self.kl is None else self.kl) + other.kl
        self.tokens = self.tokens + other.tokens
        self.loss = self.loss + other.loss


@dataclass
class UpdateMetrics:
    """Sums over the optimizer steps of one RL update (Python floats); ``record()`` reduces them."""

    diagnostics: dict[str, float] = field(default_factory=dict)
    entropy: float = 0.0
    kl: float | None = None
    tokens: float = 0.0
    loss: float = 0.0
    grad_norm: float = 0.0  # each step's gradient norm times its sequences
    sequences: float = 0.0
    optimizer_steps: int = 0

    def add_step(self, sums: StepSums, grad_norm: torch.Tensor) -> None:
        sequences = torch.tensor(float(sums.sequences), device=grad_norm.device)
        for name, value in sums.diagnostics.items():
            self.diagnostics[name] = self.diagnostics.get(name, 0.0) + float(value)
        self.entropy += float(sums.entropy)
        if sums.kl is not None:
            self.kl = (0.0 if self.kl is None else self.kl) + float(sums.kl)
        self.tokens += float(sums.tokens)
        self.loss += float(sums.loss)
        self.sequences += float(sequences)
        self.grad_norm += float(grad_norm.detach() * sequences)
        self.optimizer_steps += 1

    def record(self) -> dict:
        """The update's metrics: the loss's diagnostics by name, then ``entropy``, ``kl`` (when a
        reference exists), ``loss`` and ``grad_norm`` (a name the loss also reports, e.g. its
        own entropy, takes the trainer's token mean); non-finite values are NaN. No optimizer
        step at all (nothing had signal): ``{"optimizer_steps_skipped": True}``."""
        if self.optimizer_steps == 0:
            return {"optimizer_steps_skipped": True}
        tokens, sequences = max(self.tokens, 1.0), max(self.sequences, 1.0)
        out = {name: value / sequences for name, value in self.diagnostics.items()}
        out["entropy"] = self.entropy / tokens
        if self.kl is not None:
            out["kl"] = self.kl / tokens
        out["loss"] = self.loss / self.optimizer_steps
        out["grad_norm"] = self.grad_norm / sequences
        return {name: (value if math.isfinite(value) else float("nan")) for name, value in out.items()}
