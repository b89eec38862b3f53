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

#: a config class's __post_init__ of the installed file, executed alone on a namespace of fields (the
#: learners' modules import the RL cluster); a warning ends the script: accepted silently only
_POST_INIT_DEF = '''\
import warnings  # noqa: E402


def post_init(relative, cls, **fields):
    """``cls.__post_init__`` of the installed ``relative`` run on ``fields``: the namespace it leaves."""
    config = next(n for n in ast.parse((root / relative).read_text()).body
                  if isinstance(n, ast.ClassDef) and n.name == cls)
    node = next(n for n in config.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    namespace = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), relative, "exec"), namespace)  # Tunix's def
    self = types.SimpleNamespace(**fields)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace["__post_init__"](self)
    return self
'''
_POST_INIT = _FROM_SOURCE + _POST_INIT_DEF

TUNIX_BODIES[("tunix", "whiten_sample_single")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
out = np.asarray(algo_core.masked_whiten(jnp.array([[0.5, 9.0]]), jnp.array([[1, 0]])))
verdict("Tunix masked_whiten (rl/algo_core.py:156, Bessel's mask_sum / (mask_sum - 1)) of a batch with one "
        "counted token: the whitened values", out.tolist(),
        "an error for a sample variance of one entry (the spec; its population variance gives [[0.0, ...]])",
        bool(np.isnan(out[0, 0])))
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

TUNIX_BODIES[("tunix", "config:epsilon_low")] = _POST_INIT + """\
self = post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=0.0, epsilon_high=None,
                 epsilon_c=None, kl_method="low_var_kl")
verdict("Tunix PPOConfig(epsilon=0.2, epsilon_low=0.0).__post_init__ (rl/ppo/ppo_learner.py:101): accepted; "
        "the lower clip epsilon it keeps", self.epsilon_low, "0.0 (no lower clip), or an error",
        self.epsilon_low == 0.2)
"""

TUNIX_BODIES[("tunix", "packed_rows")] = _PPO_LOSS.replace("ppo_policy_loss_fn", "grpo_loss_fn") + """\
common_module = importlib.import_module("tunix.rl.common")
utils = importlib.import_module("tunix.rl.utils")
# two responses of one group, 1 and 3 tokens, advantages 1 and 0, each after a one-token prompt, as the
# learner hands them to sequence packing (right-padded to 3 completion tokens)
example = common_module.TrainExample(
    prompt_ids=jnp.array([[7], [7]]), prompt_mask=jnp.ones((2, 1), jnp.int32),
    completion_ids=jnp.array([[5, 0, 0], [5, 6, 8]]), completion_mask=jnp.array([[1, 0, 0], [1, 1, 1]]),
    advantages=jnp.array([1.0, 0.0]), ref_per_token_logps=None, old_per_token_logps=None)
(packed,) = next(utils.pack_sequences(iter([[example]]), max_token_budget=8))  # rl/utils.py:404
config = types.SimpleNamespace(beta=0.0, epsilon=0.2, epsilon_high=0.2, loss_algo="grpo", temperature=1.0,
                               loss_agg_mode="sequence-mean-token-mean", kl_loss_mode="kl",
                               kl_clamp_value=None)
logp = jnp.full(packed.completion_ids.shape, -1.0)
loss = float(loss_fn(Policy(logp), packed, config, 0, 1)[0])  # on-policy: ratio 1, loss -mean A
verdict("Tunix grpo_loss_fn on a sequence-packed row (rl/utils.py:404, then common.aggregate_loss), "
        "sequence-mean-token-mean, two responses of 1 and 3 tokens with advantages 1 and 0: the loss",
        f"{loss} (shape {tuple(packed.completion_ids.shape)}: one row)",
        "-0.5 (the mean over the two responses of their token means: -(1 + 0) / 2)", abs(loss + 0.25) < 1e-6)
"""

TUNIX_BODIES[("tunix", "completion_mask_pad_eos")] = _FROM_SOURCE + """\
path, lines = statements("rl/grpo/grpo_learner.py",
                         "completion_mask = np.not_equal(padded_completion_ids, pad_value)", 1)
pad_value = eos = 0  # a tokenizer whose pad id is its EOS id
padded_completion_ids = np.array([[5, 6, eos, pad_value]])  # the completion 5, 6, EOS, right-padded
scope = {"np": np, "padded_completion_ids": padded_completion_ids, "pad_value": pad_value}
exec(compile(ast.Module(body=lines, type_ignores=[]), str(path), "exec"), scope)  # Tunix's statement
mask = np.asarray(scope["completion_mask"]).astype(int)
verdict("Tunix GRPOLearner's loss mask (rl/grpo/grpo_learner.py:256; ppo_learner.py:280 likewise) of the "
        "completion 5, 6, EOS with pad id == EOS id", mask.tolist(), "[[1, 1, 1, 0]] (the EOS token is "
        "part of the response, as common.make_completion_mask keeps it)", mask[0, 2] == 0)
"""

TUNIX_BODIES[("tunix", "stale_old_logps")] = _FROM_SOURCE + _PPO_LOSS.replace(
    "ppo_policy_loss_fn", "grpo_loss_fn") + """\
path = root / "rl/grpo/grpo_learner.py"
lines = [n for n in ast.walk(ast.parse(path.read_text()))
         if isinstance(n, ast.If) and ast.unparse(n.test) == "self.algo_config.num_iterations > 1"]
# the learner's step with num_iterations=1 (GRPOConfig's default): no old log-probs are computed
scope = {"self": types.SimpleNamespace(algo_config=types.SimpleNamespace(num_iterations=1))}
exec(compile(ast.Module(body=lines, type_ignores=[]), str(path), "exec"), scope)  # Tunix's statement
old = scope["old_per_token_logps"]
# a token sampled by the rollout's stale weights (log-prob -1.5) that the optimiser has since raised to
# -1.0: ratio exp(0.5) = 1.65 > 1 + epsilon, A > 0: PPO's clip closes the gate (gradient 0)
ids = jnp.zeros((1, 1), jnp.int32)
example = types.SimpleNamespace(prompt_ids=ids, completion_ids=ids, completion_mask=jnp.ones((1, 1)),
                                advantages=jnp.ones((1,)),
                                old_per_token_logps=old, ref_per_token_logps=None)
config = types.SimpleNamespace(beta=0.0, epsilon=0.2, epsilon_high=0.2, loss_algo="grpo", temperature=1.0,
                               loss_agg_mode="sequence-mean-token-mean", kl_loss_mode="kl",
                               kl_clamp_value=None)
grad = nnx.grad(lambda model: loss_fn(model, example, config, 0, 1)[0])(Policy(jnp.full((1, 1), -1.0)))
grad = float(np.asarray(grad.logp[...])[0, 0])
verdict("Tunix GRPO learner with num_iterations=1 (rl/grpo/grpo_learner.py:284: old log-probs "
        f"{old}), grpo_loss_fn on a token the sampler drew at log-prob -1.5 and the policy now gives -1.0 "
        "(ratio 1.65 to the sampler), A = 1: d loss / d logp", f"{grad} (ratio taken as 1: unclipped)",
        "0.0 (the clip gate is closed against the sampling policy)", old is None and abs(grad + 1.0) < 1e-6)
"""

TUNIX_BODIES[("tunix", "config:num_generations")] = _POST_INIT + """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
buffer = {"enable": True, "overlong_buffer_length": 4096, "overlong_buffer_penalty": 1.0,
          "max_response_length": 20480}  # DAPOConfig's default overlong_buffer
self = post_init("rl/grpo/dapo_learner.py", "DAPOConfig", num_generations=1, loss_algo="grpo", beta=None,
                 epsilon=0.2, epsilon_high=0.28, overlong_buffer=buffer)  # DAPOConfig's defaults, G = 1
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # numpy's RuntimeWarning on a std with ddof=1 of one value, at the step
    advantages = np.asarray(algo_core.compute_advantages(np.array([1.0, 0.0]), self.num_generations))
verdict("Tunix DAPOConfig(num_generations=1).__post_init__ (rl/grpo/dapo_learner.py:75, GRPOConfig's check "
        "at grpo_learner.py:100 skipped): accepted; compute_advantages of two prompts' rewards 1 and 0",
        advantages.tolist(), "an error (GRPOConfig(num_generations=1) raises), or a documented rule for a "
        "group of one", bool(np.isnan(advantages).all()))
"""

# found by the blind source-first audit of session 15

#: a model whose logits are its one parameter (inputs ignored), so the real forward pass
#: common.compute_per_token_logps (its temperature included) runs on known logits
_LOGITS_MODEL = '''\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
common = importlib.import_module("tunix.rl.common")
from flax import nnx  # noqa: E402  (Tunix's model library)


class Model(nnx.Module):  # the logits are the parameter, whatever the tokens
    def __init__(self, logits):
        self.w = nnx.Param(logits)

    def __call__(self, tokens, positions=None, cache=None, attention_mask=None, **kwargs):
        return self.w[...], None


model = Model(jnp.asarray(np.random.default_rng(0).normal(size=(1, 4, 5)), jnp.float32))
prompt, completion = jnp.array([[3]], jnp.int32), jnp.array([[1, 2, 4]], jnp.int32)
T = 0.7  # the rollout temperature (RolloutConfig.temperature)


def method(relative, cls, name, **names):
    """Tunix's own ``def`` ``cls.name`` of the installed file, executed alone (its module imports more)."""
    path = root / relative
    body = next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"jax": jax, "common": common, **names}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


rollout = types.SimpleNamespace(_sampler=types.SimpleNamespace(model_def_and_state=lambda: nnx.split(model)),
                                pad_id=lambda: 0, eos_id=lambda: 9)
old = method("rl/rollout/vanilla_rollout.py", "VanillaRollout", "get_per_token_logps")(
    rollout, prompt, completion)
'''

TUNIX_BODIES[("tunix", "old_logps_temperature")] = _FROM_SOURCE + _LOGITS_MODEL + """\
graphdef, state = nnx.split(model)
# grpo_loss_fn's forward pass (rl/algo_core.py:386-398)
new = common.compute_per_token_logps(graphdef, state, prompt, completion, 0, 9, temperature=T)
ratio = np.exp(np.asarray(new - old))[0]
verdict("Tunix GRPO learner, num_iterations > 1, rollout temperature 0.7: old log-probs from VanillaRollout."
        "get_per_token_logps (rl/rollout/vanilla_rollout.py:82, no temperature), new ones from "
        "grpo_loss_fn's "
        "compute_per_token_logps(..., temperature=0.7), same weights: the ratios", ratio.tolist(),
        "[1.0, 1.0, 1.0] (the policy has not moved)", bool(np.abs(ratio - 1.0).max() > 1e-3))
"""

TUNIX_BODIES[("tunix", "ppo_logps_temperature")] = _FROM_SOURCE + _LOGITS_MODEL + """\
worker = types.SimpleNamespace(_model_states={"reference": nnx.split(model)})  # reference == policy
ref = method("rl/inference/inference_worker.py", "InferenceWorker", "get_ref_per_token_logps")(
    worker, prompt, completion, 0, 9, temperature=T)  # rl_cluster.py:1005 passes the rollout temperature
loss_fn = next(n for n in ast.parse((root / "rl/algo_core.py").read_text()).body
               if isinstance(n, ast.FunctionDef) and n.name == "ppo_policy_loss_fn")
call = next(n for n in ast.walk(loss_fn) if isinstance(n, ast.Call)
            and ast.unparse(n.func) == "common.compute_per_token_logps")
untempered = "temperature" not in [k.arg for k in call.keywords]  # rl/algo_core.py:198
kl = np.asarray(common.compute_kl_divergence(old, ref, method="kl"))[0]  # PPOLearner's in-reward KL
verdict("Tunix PPO, rollout temperature 0.7, policy == reference: old log-probs from VanillaRollout at T = 1 "
        f"(ppo_policy_loss_fn's forward pass at T = 1 too: {untempered}), reference at T "
        "(rl_cluster.py:1005): "
        "the per-token KL penalty (k1) of the rewards", kl.tolist(),
        "[0.0, 0.0, 0.0] (the policy is the reference)", untempered and bool(np.abs(kl).max() > 1e-3))
"""

TUNIX_BODIES[("tunix", "config:overlong_buffer")] = _SHAPING + _POST_INIT_DEF + """\
buffer = {"enable": True, "overlong_buffer_length": 4096, "overlong_buffer_penalty": 1.0,
          "max_response_length": 1024}  # L_cache 4096 > L_max 1024
self = post_init("rl/grpo/dapo_learner.py", "DAPOConfig", beta=None, epsilon=0.2, epsilon_high=0.28,
                 overlong_buffer=buffer)
value = namespace["reward_shaping"]([""], ["x"], None, overlong_buffer=buffer)[0]
verdict("Tunix DAPOConfig(overlong_buffer_length=4096, max_response_length=1024).__post_init__ "
        "(rl/grpo/dapo_learner.py:98, signs only): accepted; reward_shaping of a one-token response", value,
        "an error (DAPO needs 0 < L_cache <= L_max), or 0.0 for a response far within the budget",
        value < 0.0)
"""

TUNIX_BODIES[("tunix", "config:max_seq_token_per_tpu")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
common = importlib.import_module("tunix.rl.common")
utils = importlib.import_module("tunix.rl.utils")
completion = jnp.array([[5, 6, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10]])  # responses of 2 and 6 tokens, one group
example = common.TrainExample(
    prompt_ids=jnp.array([[7], [7]]), prompt_mask=jnp.ones((2, 1), jnp.int32), completion_ids=completion,
    completion_mask=(completion != 0).astype(jnp.int32), advantages=jnp.array([0.7071, -0.7071]),
    ref_per_token_logps=None, old_per_token_logps=None)
packs = list(utils.pack_sequences(iter([[example]]), max_token_budget=5))  # max_seq_token_per_tpu=5
trained = sum(int(p.completion_mask.sum()) for (p,) in packs)
verdict("Tunix pack_sequences (rl/utils.py:447) with max_seq_token_per_tpu=5 and responses of 1 + 2 and "
        "1 + 6 "
        "tokens: the completion tokens trained", trained, "8 (every response), or an error for a budget "
        "below a response's length", trained < 8)
"""

TUNIX_BODIES[("tunix", "entropy_neg_inf")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
logits = jnp.array([[[0.0, 1.0, -jnp.inf]]])  # a masked vocabulary entry
value = float(algo_core.compute_entropy_from_logits(logits)[0, 0])
grad = np.asarray(jax.grad(lambda x: algo_core.compute_entropy_from_logits(x).sum())(logits))
p = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()
verdict("Tunix compute_entropy_from_logits (rl/algo_core.py:172) of logits (0, 1, -inf): entropy and "
        "gradient",
        f"{value}, {grad.tolist()}", f"{float(-(p * np.log(p)).sum())} (0 log 0 = 0), a finite gradient",
        bool(np.isnan(value) or not np.isfinite(grad).all()))
"""

TUNIX_BODIES[("tunix", "vanilla_drops_eos")] = _FROM_SOURCE + """\
path, lines = statements("generate/sampler.py", "token_buffer = token_buffers[i]", 4)  # Sampler.__call__'s
helpers = root / "generate/utils.py"
node = next(n for n in ast.parse(helpers.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "np_find_first_eos_idx")
namespace = {"np": np, "jax": jax}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(helpers), "exec"), namespace)  # Tunix's own def
eos, pad = 1, 0
scope = {"token_buffers": [np.array([7, 8, 5, 6, eos, pad, pad])], "i": 0, "echo": False,
         "max_prompt_length": 2, "out_tokens": [], "utils": types.SimpleNamespace(**namespace),
         "self": types.SimpleNamespace(eos_ids=np.array([eos]),
                                       tokenizer=types.SimpleNamespace(pad_id=lambda: pad))}
exec(compile(ast.Module(body=lines, type_ignores=[]), str(path), "exec"), scope)  # Tunix's four statements
out = scope["out_tokens"][0].tolist()
verdict("Tunix Sampler.__call__ (vanilla engine, generate/sampler.py:950) on the generated tokens 5, 6, EOS: "
        "the completion handed to the learners", out, "[5, 6, 1] (the response with its EOS action)",
        eos not in out)
"""

TUNIX_BODIES[("tunix", "rollout_logps_truncation")] = _FROM_SOURCE + """\
path = root / "generate/sampler.py"
node = next(n for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "sample_top_p")
namespace = {"jax": jax, "jnp": jnp}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # Tunix's own def
logits = jnp.array([[[2.0, 1.0, 0.5, -1.0]]])  # one step, four tokens, temperature 1, top_k = 2
token, logp = namespace["sample_top_p"](logits, jax.random.PRNGKey(0), 1.0, 1.0, 2, return_logprobs=True)
z = np.asarray(logits[0, -1], dtype=np.float64)
kept = np.sort(z)[-2:]  # the two tokens top_k keeps, renormalised: the distribution sampled from
exact = float(z[int(token[0])] - np.log(np.exp(kept).sum()))
verdict("Tunix sample_top_p (generate/sampler.py:148), top_k=2 over logits (2, 1, 0.5, -1): the returned "
        f"log-prob of the sampled token {int(token[0])}", round(float(logp[0]), 6),
        f"{exact:.6f} (its log-prob under the top-2 distribution it was drawn from)",
        abs(float(logp[0]) - exact) > 1e-4)
"""

TUNIX_BODIES[("tunix", "config:epsilon_c")] = _POST_INIT + _PPO_LOSS + """\
self = post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=None, epsilon_high=0.28,
                 epsilon_c=1.1, kl_method="low_var_kl", entropy_coef=None)  # c = 1.1 < 1 + epsilon_high
r = 1.2  # inside the clip band [0.8, 1.28], A = -1
ids = jnp.zeros((1, 1), jnp.int32)
example = types.SimpleNamespace(prompt_ids=ids, completion_ids=ids, completion_mask=jnp.ones((1, 1)),
                                advantages=-jnp.ones((1, 1)),
                                old_per_token_logps=jnp.array([[-1.0 - np.log(r)]]),
                                ref_per_token_logps=None)
value, grad = jax.value_and_grad(lambda lp: loss_fn(Policy(lp), example, self, 0, 1)[0])(
    jnp.full((1, 1), -1.0))
verdict("Tunix PPOConfig(epsilon_high=0.28, epsilon_c=1.1).__post_init__ (rl/ppo/ppo_learner.py:105): "
        "accepted; "
        "ppo_policy_loss_fn at r = 1.2, A = -1: loss and d loss / d logp",
        f"{float(value)}, {float(grad[0, 0])}", "an error (c >= 1 + epsilon_high), or the clip's 1.2, 1.2",
        abs(float(grad[0, 0])) < 1e-6)
"""

TUNIX_BODIES[("tunix", "config:epsilon")] = _POST_INIT + """\
accepted = []
for relative, cls, fields in [
        ("rl/grpo/grpo_learner.py", "GRPOConfig", {"num_generations": 2, "loss_algo": "grpo"}),
        ("rl/ppo/ppo_learner.py", "PPOConfig", {"epsilon_low": None, "epsilon_high": None, "epsilon_c": None,
                                                "kl_method": "kl"})]:
    self = post_init(relative, cls, epsilon=1.5, **fields)
    accepted.append(f"{cls}(epsilon=1.5): lower clip bound {1 - getattr(self, 'epsilon_low', self.epsilon)}")
verdict("Tunix GRPOConfig / PPOConfig __post_init__ (rl/grpo/grpo_learner.py:97, rl/ppo/ppo_learner.py:100) "
        "with epsilon = 1.5", accepted, "an error: 1 - epsilon <= 0 is no lower bound for a positive ratio",
        len(accepted) == 2)
"""

TUNIX_BODIES[("tunix", "reward_nan_as_zero")] = """\
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
reward_manager = importlib.import_module("tunix.rl.reward_manager")
algorithm_config = importlib.import_module("tunix.rl.algorithm_config")


def correctness(prompts, completions, **kwargs):  # a grader that failed on the first sample
    return [float("nan"), 1.0]


def style(prompts, completions, **kwargs):
    return [0.5, 0.5]


manager = reward_manager.SequenceRewardManager([correctness, style], algorithm_config.AlgorithmConfig())
rewards = manager(prompts=["p", "p"], completions=["a", "b"], mode="train")["rewards"]
verdict("Tunix SequenceRewardManager (rl/reward_manager.py:170, np.nansum) of the reward functions "
        "(NaN, 1.0) and (0.5, 0.5): the rewards", rewards.tolist(), "[nan, 1.5] (or an error for the NaN)",
        bool(np.isfinite(rewards[0])))
"""
