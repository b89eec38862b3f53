"""Classic sampled learners on :class:`refimpl.envs.TabularEnv` (torch, batched, seeded).

spec: specs/estimators.md section 6; Sutton & Barto 2018, chapters 5, 6 and 13 (MC/TD evaluation, Q-learning,
DQN, actor-critic). Every learner runs ``num_envs`` environments in parallel and, at each step,
applies the *batch-mean* update of all transitions that share a state (or state-action pair): one
stochastic-approximation step whose noise is averaged over the batch. Step sizes follow a
Robbins-Monro schedule ``alpha_k = alpha_0 / (1 + k / k_0)^omega`` with ``omega`` in (1/2, 1]
(``sum alpha_k = inf``, ``sum alpha_k^2 < inf``); exploration follows the GLIE schedule
``eps_k = eps_0 / (1 + k / k_eps)`` (decays to 0, ``sum eps_k = inf``).

Episodes are cut by a time limit (truncation) and the learners bootstrap through it from the
value of the final observation; only termination stops bootstrapping (docs/architecture.md:
truncation is never treated as termination). "Exploring starts" (a uniformly random
first action of each episode, and a start distribution of the environment the caller chooses)
keep every state-action pair visited, which is what lets the tabular learners reach a sup-norm
accuracy in a fixed budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refimpl._checks import as_int, as_real
from refimpl.envs import TabularEnv, sample_categorical
from refimpl.estimators import discounted_returns, gae_advantages

__all__ = [
    "Schedule",
    "robbins_monro",
    "glie_epsilon",
    "epsilon_greedy",
    "MCEvaluation",
    "mc_evaluation",
    "td0_evaluation",
    "q_learning",
    "sarsa",
    "A2CResult",
    "a2c",
    "DQNResult",
    "dqn",
    "polyak_update",
]


@dataclass(frozen=True)
class Schedule:
    """``value_k = initial / (1 + k / scale)^power`` (k = 0, 1, ...)."""

    initial: float
    scale: float
    power: float = 1.0

    def __call__(self, k: int) -> float:
        return self.initial / (1.0 + k / self.scale) ** self.power


def robbins_monro(initial: float, scale: float, power: float) -> Schedule:
    """A step-size schedule satisfying Robbins-Monro (``power`` in (1/2, 1]) (spec:
    estimators.md eq. (30))."""
    if not 0.5 < power <= 1.0:
        raise ValueError(f"power must lie in (0.5, 1] for Robbins-Monro step sizes, got {power!r}")
    if not (0.0 < initial <= 1.0) or scale <= 0:
        raise ValueError(f"need initial in (0, 1] and scale > 0, got {initial!r}, {scale!r}")
    return Schedule(initial, scale, power)


def glie_epsilon(initial: float, scale: float) -> Schedule:
    """GLIE exploration ``eps_k = initial / (1 + k / scale)`` (spec: estimators.md eq. (31))."""
    if not (0.0 < initial <= 1.0) or scale <= 0:
        raise ValueError(f"need initial in (0, 1] and scale > 0, got {initial!r}, {scale!r}")
    return Schedule(initial, scale, 1.0)


def epsilon_greedy(q_rows: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``[N, A]`` probabilities: ``epsilon / A`` each plus ``1 - epsilon`` on the greedy action
    (ties broken towards the lowest index)."""
    A = q_rows.shape[-1]
    greedy = torch.nn.functional.one_hot(q_rows.argmax(-1), A).to(q_rows.dtype)
    return epsilon / A + (1.0 - epsilon) * greedy


def _batch_mean_update(table: torch.Tensor, index: torch.Tensor, delta: torch.Tensor, step: float) -> None:
    """``table[i] += step * mean(delta over batch entries with index i)`` for the visited i."""
    flat = table.view(-1)
    sums = torch.zeros_like(flat).index_add_(0, index, delta)
    counts = torch.zeros_like(flat).index_add_(0, index, torch.ones_like(delta))
    flat += step * sums / counts.clamp_min(1.0)


def _check_learner_args(env: TabularEnv, **positive_ints) -> None:
    if not isinstance(env, TabularEnv):
        raise TypeError(f"env must be a TabularEnv, got {type(env).__name__}")
    for name, v in positive_ints.items():
        if v is not None and (as_int(v) is None or as_int(v) < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


# --------------------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class MCEvaluation:
    """``values [S]`` (mean return from each start state, 0 for terminal states), ``sample_std [S]``
    and ``episodes_per_state``; ``values`` estimates the ``horizon``-step value ``V_H``."""

    values: torch.Tensor
    sample_std: torch.Tensor
    episodes_per_state: int


def mc_evaluation(env: TabularEnv, policy, episodes_per_state: int, horizon: int,
                  generator: torch.Generator) -> MCEvaluation:
    """Monte-Carlo policy evaluation from every non-terminal start state (spec: estimators.md
    eq. (32); Sutton & Barto 2018, section 5.1).

    Each episode is cut after ``horizon`` steps; the return is the ``horizon``-step discounted
    return (an explicit zero bootstrap: the estimate is unbiased for ``V_H``, which differs from V
    by at most ``gamma^H max|r| / (1 - gamma)``).
    """
    _check_learner_args(env, episodes_per_state=episodes_per_state, horizon=horizon)
    starts = torch.nonzero(~env.terminal).squeeze(1)
    start_states = starts.repeat_interleave(episodes_per_state)
    ro = env.rollout(policy, start_states.numel(), horizon, generator, max_episode_steps=horizon,
                     start_states=start_states)
    # The first episode of each row ends by column H - 1 (terminated or truncated at H); later
    # episodes in the row are cut by the end of the rollout and are not used.
    G0 = discounted_returns(ro.rewards, ro.terminated, ro.truncated, env.gamma,
                            next_values=torch.zeros_like(ro.rewards))[:, 0]
    G0 = G0.view(starts.numel(), episodes_per_state)
    values = torch.zeros(env.num_states, dtype=G0.dtype, device=env.device)
    std = torch.zeros_like(values)
    values[starts] = G0.mean(1)
    std[starts] = G0.std(1) if episodes_per_state > 1 else 0.0
    return MCEvaluation(values, std, episodes_per_state)


def td0_evaluation(env: TabularEnv, policy, generator: torch.Generator, *, num_envs: int = 1024,
                   num_steps: int = 600, max_episode_steps: int | None = 20,
                   step_size: Schedule | None = None) -> torch.Tensor:
    """TD(0) policy evaluation ``V(s) += alpha (r + gamma (1 - terminated) V(s') - V(s))``
    (spec: estimators.md eq. (33); Sutton 1988; Sutton & Barto 2018, section 6.1),
    batch-mean over the ``num_envs`` parallel transitions of each step. Returns ``V [S]``."""
    _check_learner_args(env, num_envs=num_envs, num_steps=num_steps, max_episode_steps=max_episode_steps)
    step_size = step_size or robbins_monro(1.0, 30.0, 1.0)
    V = torch.zeros(env.num_states, dtype=env.P.dtype, device=env.device)
    stream = env.transitions(policy, num_envs, generator, max_episode_steps=max_episode_steps)
    for k in range(num_steps):
        tr = next(stream)
        target = tr.rewards + env.gamma * torch.where(tr.terminated, 0.0, V[tr.next_states])
        _batch_mean_update(V, tr.states, target - V[tr.states], step_size(k))
    return V


# --------------------------------------------------------------------------------------- control




def q_learning(env: TabularEnv, generator: torch.Generator, *, num_envs: int = 4096, num_steps: int = 800,
               max_episode_steps: int | None = 2, step_size: Schedule | None = None,
               epsilon: Schedule | None = None, exploring_starts: bool = True) -> torch.Tensor:
    """Tabular Q-learning (spec: estimators.md eq. (34); Watkins & Dayan 1992; Sutton & Barto 2018,
    section 6.5):
    ``Q(s, a) += alpha (r + gamma (1 - terminated) max_a' Q(s', a') - Q(s, a))`` with epsilon-greedy
    (GLIE) behaviour. Off-policy, so exploration may decay slowly (default ``eps_k = 1 / (1 + k / 200)``);
    default step sizes ``alpha_k = 1 / (1 + k / 30)``. Returns ``Q [S, A]``."""
    _check_learner_args(env, num_envs=num_envs, num_steps=num_steps, max_episode_steps=max_episode_steps)
    step_size = step_size or robbins_monro(1.0, 30.0, 1.0)
    epsilon = epsilon or glie_epsilon(1.0, 200.0)
    S, A = env.num_states, env.num_actions
    Q = torch.zeros(S, A, dtype=env.P.dtype, device=env.device)
    eps = [epsilon(0)]

    def behaviour(states, episode_steps):
        probs = epsilon_greedy(Q[states], eps[0])
        if exploring_starts:
            probs = torch.where((episode_steps == 0)[:, None], torch.full_like(probs, 1.0 / A), probs)
        return probs

    stream = env.transitions(behaviour, num_envs, generator, max_episode_steps=max_episode_steps)
    for k in range(num_steps):
        eps[0] = epsilon(k)
        tr = next(stream)
        bootstrap = torch.where(tr.terminated, 0.0, Q[tr.next_states].max(1).values)
        sa = tr.states * A + tr.actions
        _batch_mean_update(Q, sa, tr.rewards + env.gamma * bootstrap - Q.view(-1)[sa], step_size(k))
    return Q


def sarsa(env: TabularEnv, generator: torch.Generator, *, num_envs: int = 4096, num_steps: int = 800,
          max_episode_steps: int | None = 2, step_size: Schedule | None = None,
          epsilon: Schedule | None = None, exploring_starts: bool = True) -> torch.Tensor:
    """Tabular SARSA (spec: estimators.md eq. (35); on-policy TD control):
    ``Q(s, a) += alpha (r + gamma (1 - terminated) Q(s', a') - Q(s, a))`` where ``a'`` is the
    epsilon-greedy (GLIE) action the behaviour then takes in ``s'`` (for a truncated step, an
    action drawn in the final observation only to bootstrap). SARSA's fixed point is the value of
    the epsilon-greedy policy, so epsilon must be small when the step sizes average: the default
    ``eps_k = 1 / (1 + 100 k)`` (still GLIE: it decays to 0 and its sum diverges; exploring
    starts supply the non-greedy actions) and ``alpha_k = 1 / (1 + k / 30)``. Returns ``Q [S, A]``."""
    _check_learner_args(env, num_envs=num_envs, num_steps=num_steps, max_episode_steps=max_episode_steps)
    step_size = step_size or robbins_monro(1.0, 30.0, 1.0)
    epsilon = epsilon or glie_epsilon(1.0, 0.01)
    S, A = env.num_states, env.num_actions
    Q = torch.zeros(S, A, dtype=env.P.dtype, device=env.device)
    # the committed next action of each row (-1: a new episode, choose afresh)
    pending = torch.full((num_envs,), -1, dtype=torch.int64, device=env.device)
    eps = [epsilon(0)]

    def behaviour(states, episode_steps):
        probs = epsilon_greedy(Q[states], eps[0])
        if exploring_starts:
            probs = torch.where((episode_steps == 0)[:, None], torch.full_like(probs, 1.0 / A), probs)
        committed = torch.nn.functional.one_hot(pending.clamp_min(0), A).to(probs.dtype)
        return torch.where((pending >= 0)[:, None], committed, probs)

    stream = env.transitions(behaviour, num_envs, generator, max_episode_steps=max_episode_steps)
    for k in range(num_steps):
        tr = next(stream)
        eps[0] = epsilon(k + 1)
        next_actions = sample_categorical(epsilon_greedy(Q[tr.next_states], eps[0]), generator)
        bootstrap = torch.where(tr.terminated, 0.0, Q[tr.next_states, next_actions])
        sa = tr.states * A + tr.actions
        _batch_mean_update(Q, sa, tr.rewards + env.gamma * bootstrap - Q.view(-1)[sa], step_size(k))
        pending = torch.where(tr.terminated | tr.truncated, -1, next_actions)
    return Q


# --------------------------------------------------------------------------------------- actor-critic


@dataclass(frozen=True)
class A2CResult:
    """``logits [S, A]`` of the softmax actor and ``values [S]`` of the tabular critic."""

    logits: torch.Tensor
    values: torch.Tensor

    @property
    def policy(self) -> torch.Tensor:
        return torch.softmax(self.logits, dim=1)


def a2c(env: TabularEnv, generator: torch.Generator, *, num_envs: int = 256, rollout_length: int = 5,
        num_updates: int = 200, max_episode_steps: int | None = 20, actor_lr: float = 20.0,
        critic_step: Schedule | None = None, lam: float = 0.95) -> A2CResult:
    """Synchronous advantage actor-critic (A2C; spec: estimators.md eq. (36); Mnih et al. 2016;
    Sutton & Barto 2018, section 13.5): a softmax actor ``pi = softmax(logits)`` and a tabular critic V.

    Each update collects ``rollout_length`` steps of ``num_envs`` environments, computes GAE
    advantages and value targets with the critic (bootstrapping at truncations and at the end of
    the segment), takes a gradient-ascent step on the sampled policy-gradient surrogate
    ``mean_t A_t log pi(a_t|s_t)`` (the common estimator without ``gamma^t``), and moves the critic
    towards the targets with a batch-mean Robbins-Monro step.
    """
    _check_learner_args(env, num_envs=num_envs, rollout_length=rollout_length, num_updates=num_updates,
                        max_episode_steps=max_episode_steps)
    critic_step = critic_step or robbins_monro(0.5, 50.0, 0.6)
    S, A = env.num_states, env.num_actions
    logits = torch.zeros(S, A, dtype=env.P.dtype, device=env.device, requires_grad=True)
    V = torch.zeros(S, dtype=env.P.dtype, device=env.device)

    def behaviour(states, episode_steps):
        return torch.softmax(logits.detach()[states], dim=1)

    stream = env.transitions(behaviour, num_envs, generator, max_episode_steps=max_episode_steps)
    for k in range(num_updates):
        steps = [next(stream) for _ in range(rollout_length)]
        s, a, r, s2, term, trunc = (torch.stack(f, dim=1) for f in list(zip(*steps, strict=True))[:6])
        adv, ret = gae_advantages(r, V[s], V[s2], term, trunc, env.gamma, lam)
        surrogate = (adv * torch.log_softmax(logits, dim=1)[s, a]).mean()
        (grad,) = torch.autograd.grad(surrogate, logits)
        with torch.no_grad():
            logits += actor_lr * grad
        _batch_mean_update(V, s.reshape(-1), (ret - V[s]).reshape(-1), critic_step(k))
    return A2CResult(logits.detach(), V)


# --------------------------------------------------------------------------------------- DQN


def _check_tau(tau) -> float:
    value = as_real(tau)
    if value is None or not 0.0 < value <= 1.0:
        raise ValueError(f"tau must be a number in (0, 1] (1 = hard copy), got {tau!r}")
    return value


@torch.no_grad()
def polyak_update(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    """In place ``theta^- <- tau theta + (1 - tau) theta^-`` for every parameter and buffer of
    ``target`` (same architecture as ``source``): the soft target update (Lillicrap et al. 2016;
    errata.md entry 25); ``tau = 1`` is exactly the hard copy of Mnih et al. 2015
    (``(1 - 1) theta^- + 1 theta = theta`` in floating point)."""
    tau = _check_tau(tau)
    target_state, source_state = target.state_dict(), source.state_dict()
    if target_state.keys() != source_state.keys():
        raise ValueError("target and source must have the same parameters (the same architecture)")
    for name, t in target_state.items():
        s = source_state[name]
        if t.is_floating_point():
            t.mul_(1.0 - tau).add_(s, alpha=tau)
        else:
            t.copy_(s)


@dataclass(frozen=True)
class DQNResult:
    """The trained ``q_network`` (one-hot state in, ``A`` action values out), its table
    ``q_values [S, A]`` and the final ``target_network``."""

    q_network: torch.nn.Module
    q_values: torch.Tensor
    target_network: torch.nn.Module | None = None

    @property
    def greedy_policy(self) -> torch.Tensor:
        A = self.q_values.shape[1]
        return torch.nn.functional.one_hot(self.q_values.argmax(1), A).to(self.q_values.dtype)


def dqn(env: TabularEnv, generator: torch.Generator, *, num_envs: int = 32, num_steps: int = 600,
        max_episode_steps: int | None = 20, hidden: int = 64, buffer_capacity: int = 20_000,
        batch_size: int = 128, lr: float = 3e-3, target_period: int = 50, learning_starts: int = 20,
        epsilon: Schedule | None = None, lr_decay: bool = True, tau: float = 1.0) -> DQNResult:
    """DQN on one-hot state features (spec: estimators.md eq. (37); Mnih et al. 2015): an MLP
    ``Q_theta``, a replay buffer of ``(s, a, r, s', terminated)`` sampled uniformly, a target network
    updated every ``target_period`` gradient steps, the loss ``mean (Q_theta(s, a) - r - gamma
    (1 - terminated) max_a' Q_target(s', a'))^2`` minimised with Adam, and GLIE epsilon-greedy
    behaviour. With ``lr_decay`` the learning rate decays linearly to 0 over the gradient steps (a
    Robbins-Monro-like end to the SGD noise, which matters when action gaps are small). The
    network is initialised from ``generator`` (no global RNG).

    The target update is ``theta^- <- tau theta + (1 - tau) theta^-`` (:func:`polyak_update`):
    ``tau = 1`` (default) is the hard copy of Mnih et al. 2015 (every C steps), ``tau < 1``
    the exponential moving average ("Polyak averaging") of Lillicrap et al. 2016 (usually
    with ``target_period = 1`` and a small tau such as 0.005; specs/errata.md entry 25).
    """
    _check_learner_args(env, num_envs=num_envs, num_steps=num_steps, max_episode_steps=max_episode_steps,
                        hidden=hidden, buffer_capacity=buffer_capacity, batch_size=batch_size,
                        target_period=target_period)
    tau = _check_tau(tau)
    epsilon = epsilon or glie_epsilon(1.0, 50.0)
    S, A, dt, dev = env.num_states, env.num_actions, env.P.dtype, env.device
    net = torch.nn.Sequential(torch.nn.Linear(S, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, A))
    net = net.to(device=dev, dtype=dt)
    with torch.no_grad():
        for layer in (net[0], net[2]):
            bound = layer.in_features ** -0.5
            layer.weight.uniform_(-bound, bound, generator=generator)
            layer.bias.uniform_(-bound, bound, generator=generator)
    target = torch.nn.Sequential(torch.nn.Linear(S, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, A))
    target = target.to(device=dev, dtype=dt)
    target.load_state_dict(net.state_dict())
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    num_updates = max(num_steps - learning_starts, 1)
    eye = torch.eye(S, dtype=dt, device=dev)
    buf_s = torch.zeros(buffer_capacity, dtype=torch.int64, device=dev)
    buf_a, buf_s2 = torch.zeros_like(buf_s), torch.zeros_like(buf_s)
    buf_r = torch.zeros(buffer_capacity, dtype=dt, device=dev)
    buf_term = torch.zeros(buffer_capacity, dtype=torch.bool, device=dev)
    size, head, eps = 0, 0, [epsilon(0)]

    def behaviour(states, episode_steps):
        with torch.no_grad():
            return epsilon_greedy(net(eye[states]), eps[0])

    stream = env.transitions(behaviour, num_envs, generator, max_episode_steps=max_episode_steps)
    for k in range(num_steps):
        eps[0] = epsilon(k)
        tr = next(stream)
        idx = (head + torch.arange(num_envs, device=dev)) % buffer_capacity
        buf_s[idx], buf_a[idx], buf_r[idx] = tr.states, tr.actions, tr.rewards
        buf_s2[idx], buf_term[idx] = tr.next_states, tr.terminated
        head, size = (head + num_envs) % buffer_capacity, min(size + num_envs, buffer_capacity)
        if k < learning_starts:
            continue
        j = torch.randint(size, (batch_size,), generator=generator, device=dev)
        with torch.no_grad():
            best_next = target(eye[buf_s2[j]]).max(1).values
            y = buf_r[j] + env.gamma * torch.where(buf_term[j], 0.0, best_next)
        q = net(eye[buf_s[j]]).gather(1, buf_a[j][:, None]).squeeze(1)
        loss = torch.mean((q - y) ** 2)
        optimizer.zero_grad()
        loss.backward()
        if lr_decay:
            for group in optimizer.param_groups:
                group["lr"] = lr * (1.0 - (k - learning_starts) / num_updates)
        optimizer.step()
        if (k - learning_starts + 1) % target_period == 0:
            polyak_update(target, net, tau)
    with torch.no_grad():
        return DQNResult(net, net(eye), target)
