"""Tunix's standalone reproductions (JAX and numpy in place of torch: repro.py's ``ARRAYS`` preamble),
keyed as repro_bodies.py's ``BODIES``."""

from __future__ import annotations

__all__ = ["TUNIX_BODIES"]

TUNIX_BODIES: dict[tuple[str, str], str] = {}

TUNIX_BODIES[("tunix", "ratio_overflow")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
from flax import nnx  # noqa: E402  (Tunix's model library: its losses take an nnx model)


class Policy(nnx.Module):  # a policy whose forward pass returns its one parameter, the log-probs
    def __init__(self, logp):
        self.logp = nnx.Param(logp)


def forward(graphdef, state, **kwargs):  # stands in for common.compute_per_token_logps (the model)
    logp = nnx.merge(graphdef, state).logp[...]
    return (logp, jnp.zeros((*logp.shape, 1))) if kwargs.get("return_logits") else logp


fn = algo_core.ppo_policy_loss_fn
common = types.SimpleNamespace(**{**vars(algo_core.common), "compute_per_token_logps": forward})
loss_fn = types.FunctionType(fn.__code__, {**fn.__globals__, "common": common}, fn.__name__, fn.__defaults__)
# float32: one token with log-ratio 95 (old log-prob -100: a stale token), A > 0, above 1 + eps_high:
# the clip gate is closed, the exact gradient of that token is 0 (and the loss finite)
ids = jnp.zeros((1, 2), jnp.int32)
example = types.SimpleNamespace(prompt_ids=jnp.zeros((1, 1), jnp.int32), completion_ids=ids,
                                completion_mask=jnp.ones((1, 2)), advantages=jnp.ones((1, 2)),
                                old_per_token_logps=jnp.array([[-100.0, -1.0]]), ref_per_token_logps=None)
config = types.SimpleNamespace(epsilon_low=0.2, epsilon_high=0.2, entropy_coef=None)
grad = nnx.grad(lambda model: loss_fn(model, example, config, 0, 1)[0])(Policy(jnp.array([[-5.0, -0.875]])))
grad = np.asarray(grad.logp[...])
verdict("Tunix ppo_policy_loss_fn (rl/algo_core.py:214), float32 log-ratio 95 under a closed gate: "
        "d loss / d logp", grad.tolist(), f"[[0.0, {-float(np.exp(np.float32(0.125))) / 2}]] (0 where the "
        "gate is closed)", bool(np.isnan(grad[0, 0])))
"""
