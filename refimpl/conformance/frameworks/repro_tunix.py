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

#: tunix/rl/algo_core.py imported without the package __init__, its ppo_policy_loss_fn with the model's
#: forward pass replaced by a stand-in returning the policy's one parameter, the log-probs
_PPO_LOSS = '''\
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
'''

#: a file's top-level def (or the statements from a line's) executed alone: Tunix's trainers import the
#: RL cluster
_FROM_SOURCE = '''\
import ast  # noqa: E402
import typing  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("tunix").submodule_search_locations)))


def statements(relative, first, count):
    """``count`` statements of the installed file, from the one whose source is ``first``."""
    path = root / relative
    for node in ast.walk(ast.parse(path.read_text())):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for i, statement in enumerate(body):
                if ast.unparse(statement) == first:
                    return path, body[i:i + count]
    raise SystemExit(print(f"{relative} has no statement {first!r}") or 2)
'''

TUNIX_BODIES[("tunix", "clip_bound_tie")] = _PPO_LOSS + """\
# a float32 log-ratio whose exp is exactly the lower clip bound 1 - 0.2 (as jnp.clip compares it)
bound = np.float32(0.8)
d = np.float32(np.log(0.8))
for step in range(64):
    if np.asarray(jnp.exp(jnp.float32(d))) == bound:
        break
    d = np.nextafter(d, np.float32(1.0) if np.asarray(jnp.exp(jnp.float32(d))) < bound else np.float32(-1.0))
ids = jnp.zeros((1, 1), jnp.int32)
example = types.SimpleNamespace(prompt_ids=jnp.zeros((1, 1), jnp.int32), completion_ids=ids,
                                completion_mask=jnp.ones((1, 1)), advantages=jnp.ones((1, 1)),
                                old_per_token_logps=jnp.zeros((1, 1)), ref_per_token_logps=None)
config = types.SimpleNamespace(epsilon_low=0.2, epsilon_high=0.2, entropy_coef=None)
grad = nnx.grad(lambda model: loss_fn(model, example, config, 0, 1)[0])(Policy(jnp.full((1, 1), d)))
grad = float(np.asarray(grad.logp[...])[0, 0])
verdict("Tunix ppo_policy_loss_fn (rl/algo_core.py:223; grpo_loss_fn's :438 likewise), A = 1 at a float32 "
        f"ratio exactly on the lower clip bound {float(bound)}: d loss / d logp (max(-A r, -A clip(r)) is "
        "-A r "
        "on both sides of that bound: no kink)", grad,
        f"{-float(bound)} (-A r, unique)", abs(grad - 0.75 * -float(bound)) < 1e-6)
"""

TUNIX_BODIES[("tunix", "whiten_sample_single")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
out = np.asarray(algo_core.masked_whiten(jnp.array([[0.5, 9.0]]), jnp.array([[1, 0]])))
verdict("Tunix masked_whiten (rl/algo_core.py:156, Bessel's mask_sum / (mask_sum - 1)) of a batch with one "
        "counted token: the whitened values", out.tolist(),
        "[[0.0, ...]] (one entry: centred 0, variance 0; the spec gives 0)", bool(np.isnan(out[0, 0])))
"""

_SHAPING = _FROM_SOURCE + """\
path = root / "rl/grpo/dapo_learner.py"
node = next(n for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "reward_shaping")
namespace = {"Any": typing.Any, "Dict": typing.Dict, "List": typing.List,
             "rl_cluster_lib": types.SimpleNamespace(Mode=object)}  # annotations only
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # Tunix's own def
buffer = {"overlong_buffer_length": 4096, "overlong_buffer_penalty": 1.0,
          "max_response_length": 20480}  # DAPOConfig's default overlong_buffer
"""

TUNIX_BODIES[("tunix", "overlong_floor")] = _SHAPING + """\
length = 20480 + 2 * 4096  # two buffers past the budget (one character per token here)
value = namespace["reward_shaping"]([""], ["x" * length], None, overlong_buffer=buffer)[0]
verdict("Tunix DAPOLearner reward_shaping (rl/grpo/dapo_learner.py:126, no floor), the default buffer, a "
        f"response of {length} one-character tokens, past max_response_length 20480: the penalty", value,
        "-1.0 (DAPO's soft overlong punishment beyond the budget)", value < -1.0)
"""

TUNIX_BODIES[("tunix", "overlong_characters")] = _SHAPING + """\
completion = "abcd" * 5000  # 5000 tokens of 4 characters: 20000 characters, within the token budget
value = namespace["reward_shaping"]([""], [completion], None, overlong_buffer=buffer)[0]
verdict("Tunix DAPOLearner reward_shaping (rl/grpo/dapo_learner.py:124, len(completion): characters), the "
        "default buffer (token budgets 20480 / 4096), a completion of 5000 tokens of 4 characters: the "
        "penalty", value, "0.0 (5000 tokens <= 20480 - 4096)", value < 0.0)
"""

TUNIX_BODIES[("tunix", "ppo_rewards_int32")] = _FROM_SOURCE + """\
path, lines = statements("rl/ppo/ppo_learner.py", "rewards = jnp.zeros_like(jax_completion_ids)", 2)
padded_completion_ids = np.array([[5, 6, 7]])  # token ids, as the learner pads them (numpy integers)
scope = {"jnp": jnp, "jax_completion_ids": jnp.array(padded_completion_ids), "batch_size": 1,
         "eos_idx": jnp.array([2]), "jax_last_token_scores": jnp.array([0.7])}  # a score of 0.7 at the EOS
exec(compile(ast.Module(body=lines, type_ignores=[]), str(path), "exec"), scope)  # Tunix's two statements
rewards = np.asarray(scope["rewards"])
verdict("Tunix PPOLearner's token rewards (rl/ppo/ppo_learner.py:353-356) for a score of 0.7 on the last "
        f"token: the rewards ({rewards.dtype})", rewards.tolist(), "[[0.0, 0.0, 0.7]]",
        float(rewards[0, 2]) != 0.7)
"""

TUNIX_BODIES[("tunix", "config:dynamic_sampling")] = _FROM_SOURCE + """\
import warnings  # noqa: E402

warnings.simplefilter("error")  # a warning about the setting would end the script: accepted silently only
tree = ast.parse((root / "rl/grpo/dapo_learner.py").read_text())
config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DAPOConfig")
default = next(ast.literal_eval(n.value) for n in config.body
               if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "dynamic_sampling")
uses = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1) if "dynamic_sampling" in line]
verdict("Tunix DAPOConfig.dynamic_sampling (rl/grpo/dapo_learner.py:65, default "
        f"{default}): every line of the installed package naming it", uses,
        "a read of the setting: DAPO's dynamic sampling drops the groups whose rewards are all equal",
        default is True and all(u.startswith("rl/grpo/dapo_learner.py:") for u in uses) and len(uses) <= 2)
"""
