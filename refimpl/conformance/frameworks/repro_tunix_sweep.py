"""Tunix's standalone reproductions of the session-15 sweep's validation findings (configuration fields
accepted in a nonsensical range or silently ignored), keyed as repro_bodies.py's ``BODIES``; the earlier
ones are repro_tunix.py's (whose ``_FROM_SOURCE`` helpers these reuse)."""

from __future__ import annotations

from .repro_tunix import _FROM_SOURCE, _POST_INIT

__all__ = ["TUNIX_SWEEP_BODIES"]

TUNIX_SWEEP_BODIES: dict[tuple[str, str], str] = {}


TUNIX_SWEEP_BODIES[("tunix", "config:kl_clamp_value")] = """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algorithm_config = importlib.import_module("tunix.rl.algorithm_config")
common = importlib.import_module("tunix.rl.common")
import warnings  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("error")  # a warning about the setting would end the script: accepted silently only
    config = algorithm_config.AlgorithmConfig(kl_clamp_value=-1.0)
logp, ref = jnp.array([[-1.0, -2.0, -0.5]]), jnp.array([[-1.5, -1.0, -0.5]])
kl, grad = jax.value_and_grad(lambda x: common.compute_kl_divergence(
    x, ref, "low_var_kl", clamp_value=config.kl_clamp_value).sum())(logp)
exact = jax.value_and_grad(lambda x: common.compute_kl_divergence(x, ref, "low_var_kl").sum())(logp)
verdict("Tunix AlgorithmConfig(kl_clamp_value=-1.0) (rl/algorithm_config.py:39): accepted; "
        "compute_kl_divergence (rl/common.py:165) with it: the summed k3 and its gradient",
        [float(kl), np.asarray(grad).tolist()], f"[{float(exact[0]):.6f}, {np.asarray(exact[1]).tolist()}] "
        "(or an error: the clamp is documented as a positive float)", float(kl) < 0.0)
"""

TUNIX_SWEEP_BODIES[("tunix", "config:beta")] = _POST_INIT + """\
accepted = []
for relative, cls, fields in [
        ("rl/grpo/grpo_learner.py", "GRPOConfig", {"num_generations": 2, "loss_algo": "grpo"}),
        ("rl/ppo/ppo_learner.py", "PPOConfig", {"epsilon": 0.2, "epsilon_low": None, "epsilon_high": None,
                                                "epsilon_c": None, "kl_method": "kl"}),
        ("rl/agentic/agentic_grpo_learner.py", "GRPOConfig", {"num_generations": 2, "loss_algo": "grpo",
                                                              "epsilon": 0.2, "epsilon_high": None})]:
    self = post_init(relative, cls, beta=-0.04, **fields)
    accepted.append(f"{relative}:{cls}(beta={self.beta})")
verdict("Tunix GRPOConfig / PPOConfig / agentic GRPOConfig __post_init__ (rl/grpo/grpo_learner.py:95) with "
        "beta = -0.04 (a KL penalty that rewards divergence from the reference)", accepted,
        "an error: the KL coefficient is >= 0", len(accepted) == 3)
"""

TUNIX_SWEEP_BODIES[("tunix", "config:clip_range_value")] = _POST_INIT + """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
from flax import nnx  # noqa: E402  (Tunix's model library: its losses take an nnx model)

self = post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=None, epsilon_high=None,
                 epsilon_c=None, kl_method="low_var_kl", clip_range_value=-0.2)


class Critic(nnx.Module):  # a critic whose forward pass returns its one parameter, the values
    def __init__(self, scores):
        self.scores = nnx.Param(scores)


def compute_score(model, prompt_ids, completion_ids, pad_id, eos_id, **kwargs):  # the critic's forward
    return model.scores[...]


fn = algo_core.ppo_value_loss_fn
common = types.SimpleNamespace(**{**vars(algo_core.common), "compute_score": compute_score})
loss_fn = types.FunctionType(fn.__code__, {**fn.__globals__, "common": common}, fn.__name__, fn.__defaults__)
# one prompt token and one completion token: the critic's scores [prompt, completion], its value the
# prompt position's (vpreds[:, -2:-1]); old value 0, return 1, new prediction 0.1
example = types.SimpleNamespace(prompt_ids=jnp.zeros((1, 1), jnp.int32),
                                completion_ids=jnp.zeros((1, 1), jnp.int32), completion_mask=jnp.ones((1, 1)),
                                old_values=jnp.zeros((1, 1)), returns=jnp.ones((1, 1)))


def loss_and_grad(clip):
    loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, example, clip, 0, 1)[0])(
        Critic(jnp.array([[0.1, 0.0]])))
    return round(float(loss), 6), round(float(np.asarray(grads.scores[...])[0, 0]), 6)


framework, exact = loss_and_grad(self.clip_range_value), loss_and_grad(0.2)
verdict(f"Tunix PPOConfig(clip_range_value={self.clip_range_value}) (rl/ppo/ppo_learner.py:97): accepted; "
        "ppo_value_loss_fn (rl/algo_core.py:314) for old value 0, return 1, prediction 0.1: (loss, gradient)",
        framework, f"{exact} (clip_range_value=0.2), or an error for a negative range",
        framework[1] == 0.0 and exact[1] != 0.0)
"""

TUNIX_SWEEP_BODIES[("tunix", "config:gae_lambda")] = _POST_INIT + """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
algo_core = importlib.import_module("tunix.rl.algo_core")
self = post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=None, epsilon_high=None,
                 epsilon_c=None, kl_method="low_var_kl", gamma=1.5, gae_lambda=1.0)
post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=None, epsilon_high=None,
          epsilon_c=None, kl_method="low_var_kl", gamma=1.0, gae_lambda=-0.5)  # accepted as well
rewards, values = jnp.array([[0.0, 0.0, 1.0]]), jnp.zeros((1, 3))
_, returns = algo_core.compute_gae_advantages(rewards, values, jnp.ones((1, 3), jnp.int32),
                                              self.gamma, self.gae_lambda)
returns = np.asarray(returns).round(6).tolist()
verdict("Tunix PPOConfig(gamma=1.5, gae_lambda=1.0) and PPOConfig(gae_lambda=-0.5) "
        "(rl/ppo/ppo_learner.py:90): accepted; compute_gae_advantages' returns for a reward of 1 at the last "
        "of three tokens", returns,
        "an error (gamma, lambda in [0, 1]); a return is at most the reward sum, 1", returns[0][0] > 1.0)
"""

TUNIX_SWEEP_BODIES[("tunix", "config:sampler_is")] = _POST_INIT + """\
self = post_init("rl/agentic/agentic_grpo_learner.py", "GRPOConfig", num_generations=2, loss_algo="grpo",
                 epsilon=0.2, epsilon_high=None, sampler_is="sequence", use_rollout_logps=True)
path = root / "rl/agentic/agentic_grpo_learner.py"
tests = sorted({ast.unparse(n) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Compare)
                and "sampler_is" in ast.unparse(n.left) and "threshold" not in ast.unparse(n)})
verdict("Tunix agentic GRPOConfig(sampler_is='sequence') (rl/agentic/agentic_grpo_learner.py:125): accepted; "
        "every test of the setting in the learner", [f"sampler_is={self.sampler_is!r}", tests],
        "an error (None | 'token' only): 'sequence' applies no correction, silently",
        tests == ["self.algo_config.sampler_is == 'token'"])
"""

TUNIX_SWEEP_BODIES[("tunix", "config:sampler_is_threshold")] = _POST_INIT + """\
self = post_init("rl/agentic/agentic_grpo_learner.py", "GRPOConfig", num_generations=2, loss_algo="grpo",
                 epsilon=0.2, epsilon_high=None, sampler_is="token", sampler_is_threshold=0.0)
path, lines = statements("rl/agentic/agentic_grpo_learner.py",
                         "log_ratio = trainer_per_token_logps - rollout_per_token_logps", 3)
scope = {"jnp": jnp, "jax": jax, "self": types.SimpleNamespace(algo_config=self),
         "trainer_per_token_logps": jnp.array([[-1.0, -2.0, -0.5]]),
         "rollout_per_token_logps": jnp.array([[-1.1, -1.9, -0.5]]), "asst_mask_f": jnp.ones((1, 3))}
exec(compile(ast.Module(body=lines, type_ignores=[]), str(path), "exec"), scope)  # Tunix's statements
weights = np.asarray(scope["sampler_is_weights"]).round(6).tolist()
verdict("Tunix agentic GRPOConfig(sampler_is='token', sampler_is_threshold=0.0) "
        "(rl/agentic/agentic_grpo_learner.py:126): accepted; the truncated IS weights that multiply each "
        "token's policy loss (agentic_grpo_learner.py:668)", weights,
        "an error (a cap C > 0): the weights for the trainer-sampler ratios (1.105, 0.905, 1.0) capped at 2",
        all(w == 0.0 for w in weights[0]))
"""

TUNIX_SWEEP_BODIES[("tunix", "config:top_p")] = _FROM_SOURCE + """\
stand_ins("humanize")  # tunix/sft/utils.py's memory log lines
bare_packages("tunix")  # the package __init__ imports the trainers, samplers and checkpointing
common = importlib.import_module("tunix.rl.common")
tree = ast.parse((root / "rl/rollout/base_rollout.py").read_text())
config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RolloutConfig")
checks = [n.name for n in config.body if isinstance(n, ast.FunctionDef)]  # no __post_init__: no check
path = root / "generate/sampler.py"
node = next(n for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "sample_top_p")
namespace = {"jax": jax, "jnp": jnp}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # Tunix's own def
logits = jnp.log(jnp.array([[[0.665, 0.245, 0.090]]]))  # one step, three tokens, temperature 1
draws = [int(namespace["sample_top_p"](logits, jax.random.PRNGKey(i), 1.0, 0.5, None)[0][0])
         for i in range(200)]
sampled = [draws.count(t) / len(draws) for t in range(3)]
trained = np.exp(np.asarray(common.selective_log_softmax(logits[0], jnp.array([0, 1, 2])))).round(3).tolist()
verdict("Tunix RolloutConfig(top_p=0.5) (rl/rollout/base_rollout.py:85, methods: " + str(checks) + "): "
        "accepted; the vanilla sampler's token frequencies (sample_top_p, 200 draws) and the trainer's "
        "probabilities (common.selective_log_softmax, rl/common.py:384)", [sampled, trained],
        "equal (the log-probs trained are the sampling policy's), or an error for top_p < 1",
        sampled[0] == 1.0 and trained[0] < 0.7 and "__post_init__" not in checks)
"""

TUNIX_SWEEP_BODIES[("tunix", "config:entropy_coef")] = _POST_INIT + """\
self = post_init("rl/ppo/ppo_learner.py", "PPOConfig", epsilon=0.2, epsilon_low=None, epsilon_high=None,
                 epsilon_c=None, kl_method="low_var_kl", entropy_coef=-0.01)
path = root / "rl/algo_core.py"
loss_fn = next(n for n in ast.parse(path.read_text()).body
               if isinstance(n, ast.FunctionDef) and n.name == "ppo_policy_loss_fn")
applied = [ast.unparse(n.test) for n in ast.walk(loss_fn) if isinstance(n, ast.If)
           and "entropy_coef" in ast.unparse(n.test)]
learner = (root / "rl/ppo/ppo_learner.py").read_text()
logged = "and self.algo_config.entropy_coef > 0.0" in learner
verdict(f"Tunix PPOConfig(entropy_coef={self.entropy_coef}) (rl/ppo/ppo_learner.py:96): accepted; the test "
        "that applies it in ppo_policy_loss_fn (rl/algo_core.py:249), and whether loss/entropy is logged "
        "for it",
        [applied, f"logged: {logged and self.entropy_coef > 0.0}"],
        "an error (an entropy bonus's coefficient is >= 0)",
        applied == ["entropy_coef is not None and entropy_coef != 0.0"] and logged)
"""
