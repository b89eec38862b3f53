"""A batched tabular environment: many episodes of a finite MDP sampled at once (torch).

spec: estimators.md section 1. The environment holds raw tensors (it does not import ``tabular``,
docs/architecture.md, contract) and is device-agnostic: every tensor it makes lives on the device of
``P``. All randomness comes from an explicit ``torch.Generator``.

Episode ends are kept in two distinct flags (never merged):

- ``terminated``: the step arrived in a terminal state; the return after it is exactly 0, so
  estimators must not bootstrap.
- ``truncated``: a time limit (``max_episode_steps``) cut the episode in a non-terminal state; the
  return after it is *not* 0, and estimators bootstrap from the value of the step's final
  observation, which :class:`Rollout` keeps in ``next_states`` (the reset state of the next episode
  is stored separately, in the following step's ``states``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from refimpl._checks import check_discount, check_rows_stochastic

__all__ = ["TabularEnv", "Rollout", "Transition", "sample_categorical"]

_ATOL = 1e-6


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs [N, K]`` (rows are distributions), ``[N]`` int64.

    Inverse-CDF sampling with a single uniform per row, so it is reproducible from ``generator``
    on any device.
    """
    if probs.ndim != 2:
        raise ValueError(f"probs must be [N, K], got shape {tuple(probs.shape)}")
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=probs.dtype)
    cdf = probs.cumsum(-1)
    idx = (u * cdf[:, -1:] >= cdf).sum(-1)  # first k with cdf_k > u (zero-probability k skipped)
    return idx.clamp_max(probs.shape[1] - 1)


class Transition(NamedTuple):
    """One batched step: every field ``[N]``, with the meanings of :class:`Rollout`'s columns."""

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    episode_steps: torch.Tensor
    behavior_logp: torch.Tensor


@dataclass(frozen=True)
class Rollout:
    """``num_steps`` steps of ``N`` parallel environments; every field is ``[N, T]``.

    ``states[:, t]`` is the observation the action ``actions[:, t]`` was taken in,
    ``next_states[:, t]`` the observation it led to (for an ended episode its *final* observation,
    never the reset state), ``rewards[:, t]`` the reward of that step, ``terminated[:, t]`` /
    ``truncated[:, t]`` whether the episode ended there by reaching a terminal state / by the time
    limit (never both), ``episode_steps[:, t]`` the step's index inside its episode, and
    ``behavior_logp[:, t]`` the log-probability of the action under the policy that chose it.
    """

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    episode_steps: torch.Tensor
    behavior_logp: torch.Tensor


class TabularEnv:
    """``N`` independent copies of the finite MDP ``(P, r, rho0, gamma, terminal)``.

    Args:
        P: ``[S, A, S]`` transition probabilities.
        r: ``[S, A]`` rewards ``r(s, a)`` (deterministic given s, a) or ``[S, A, S]`` rewards
            ``r(s, a, s')`` paid on the sampled transition.
        rho0: ``[S]`` start distribution; it may not put mass on terminal states.
        gamma: discount in [0, 1] (stored for learners; the environment itself does not discount).
        terminal: ``[S]`` bool, absorbing terminal states; arriving in one ends the episode with
            ``terminated = True``. Stepping *from* a terminal state is an error.

    The float dtype of ``P`` (float32 or float64) is used for rewards and probabilities.
    """

    def __init__(self, P, r, rho0, gamma: float, terminal=None) -> None:
        P = torch.as_tensor(P)
        if not P.is_floating_point():
            raise TypeError(f"P must be a floating tensor, got dtype {P.dtype}")
        if P.ndim != 3 or P.shape[0] != P.shape[2] or P.shape[0] == 0 or P.shape[1] == 0:
            raise ValueError(f"P must have shape [S, A, S], got {tuple(P.shape)}")
        S, A, _ = P.shape
        dev, dt = P.device, P.dtype
        r = torch.as_tensor(r, device=dev, dtype=dt)
        rho0 = torch.as_tensor(rho0, device=dev, dtype=dt)
        for name, x in (("P", P), ("r", r), ("rho0", rho0)):
            _check_finite(x, name)
        check_rows_stochastic(P, "P", _ATOL)
        if tuple(r.shape) not in ((S, A), (S, A, S)):
            raise ValueError(f"r must have shape [S, A] = {(S, A)} or [S, A, S], got {tuple(r.shape)}")
        if tuple(rho0.shape) != (S,):
            raise ValueError(f"rho0 must have shape [S] = ({S},), got {tuple(rho0.shape)}")
        check_rows_stochastic(rho0, "rho0", _ATOL)
        gamma = check_discount(gamma)
        if terminal is None:
            terminal = torch.zeros(S, dtype=torch.bool, device=dev)
        terminal = torch.as_tensor(terminal, device=dev)
        if terminal.dtype != torch.bool or tuple(terminal.shape) != (S,):
            raise ValueError(f"terminal must be a bool tensor of shape [S] = ({S},)")
        if (rho0[terminal] > 0).any():
            raise ValueError("rho0 puts mass on terminal states: an episode would end before it starts")
        self.P, self.r, self.rho0, self.gamma, self.terminal = P, r, rho0, float(gamma), terminal

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    @property
    def device(self) -> torch.device:
        return self.P.device

    def reset(self, num_envs: int, generator: torch.Generator | None) -> torch.Tensor:
        """``[num_envs]`` start states drawn from ``rho0``."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        return sample_categorical(self.rho0.expand(num_envs, -1), generator)

    def step(self, states: torch.Tensor, actions: torch.Tensor, generator: torch.Generator | None):
        """One transition for each of ``N`` environments.

        Returns ``(next_states [N], rewards [N], terminated [N])``; ``terminated`` is True where
        ``next_states`` is terminal. No reset happens here (see :meth:`rollout`).
        """
        if states.shape != actions.shape or states.ndim != 1:
            raise ValueError(f"states and actions must be [N], got {tuple(states.shape)}, "
                             f"{tuple(actions.shape)}")
        if self.terminal[states].any():
            raise ValueError("cannot step from a terminal state: the episode has ended")
        next_states = sample_categorical(self.P[states, actions], generator)
        if self.r.ndim == 2:
            rewards = self.r[states, actions]
        else:
            rewards = self.r[states, actions, next_states]
        return next_states, rewards, self.terminal[next_states]

    def transitions(
        self,
        policy,
        num_envs: int,
        generator: torch.Generator | None,
        *,
        max_episode_steps: int | None = None,
        start_states: torch.Tensor | None = None,
    ) -> Iterator[Transition]:
        """Endless stream of batched steps of ``num_envs`` environments with automatic resets.

        Args:
            policy: ``[S, A]`` row-stochastic tensor, or a callable
                ``(states [N], episode_steps [N]) -> probs [N, A]`` called before every step (so a
                learner may change it between steps).
            max_episode_steps: time limit; a step that makes an episode this long without reaching
                a terminal state is ``truncated`` (None: no limit).
            start_states: ``[num_envs]`` int64 states for the first episodes (default: drawn from
                rho0); later episodes always start from rho0.

        An ended episode (terminated or truncated) is followed at once by a fresh one in the same
        row; its final observation is the step's ``next_states``, the fresh start the next step's
        ``states``.
        """
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")
        probs_of = self._policy_fn(policy)
        if start_states is None:
            s = self.reset(num_envs, generator)
        else:
            s = torch.as_tensor(start_states, device=self.device)
            if tuple(s.shape) != (num_envs,) or s.dtype != torch.int64:
                raise ValueError(f"start_states must be int64 of shape [{num_envs}]")
            if ((s < 0) | (s >= self.num_states)).any() or self.terminal[s].any():
                raise ValueError("start_states must be valid non-terminal states")
        t_ep = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        while True:
            probs = probs_of(s, t_ep)
            a = sample_categorical(probs, generator)
            s2, rew, term = self.step(s, a, generator)
            if max_episode_steps is None:
                trunc = torch.zeros_like(term)
            else:
                trunc = ~term & (t_ep + 1 >= max_episode_steps)
            logp = probs.gather(1, a[:, None]).squeeze(1).log()
            yield Transition(s, a, rew, s2, term, trunc, t_ep, logp)
            done = term | trunc
            if done.any():
                s2 = torch.where(done, self.reset(num_envs, generator), s2)
            t_ep = torch.where(done, torch.zeros_like(t_ep), t_ep + 1)
            s = s2

    def rollout(
        self,
        policy,
        num_envs: int,
        num_steps: int,
        generator: torch.Generator | None,
        *,
        max_episode_steps: int | None = None,
        start_states: torch.Tensor | None = None,
    ) -> Rollout:
        """The first ``num_steps`` steps of :meth:`transitions`, stacked into ``[N, T]`` fields."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        stream = self.transitions(policy, num_envs, generator, max_episode_steps=max_episode_steps,
                                  start_states=start_states)
        steps = [next(stream) for _ in range(num_steps)]
        return Rollout(*(torch.stack(field, dim=1) for field in zip(*steps, strict=True)))

    def _policy_fn(self, policy):
        if callable(policy):
            return policy
        pi = torch.as_tensor(policy, device=self.device, dtype=self.P.dtype)
        if tuple(pi.shape) != (self.num_states, self.num_actions):
            raise ValueError(f"policy must be [S, A] = {(self.num_states, self.num_actions)}, "
                             f"got {tuple(pi.shape)}")
        _check_finite(pi, "policy")
        check_rows_stochastic(pi, "policy", _ATOL)
        return lambda s, episode_steps: pi[s]
