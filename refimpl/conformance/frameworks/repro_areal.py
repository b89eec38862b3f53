"""AReaL's standalone reproductions of the findings in its group-advantage, whitening, KL-reward and
overlong-penalty modes (areal_kinds.py) and of GSPO/SAPO's fixed aggregation: ``areal_bodies(areal)``
returns them keyed as repro_bodies.py's ``BODIES``, given its preamble that loads AReaL's functional.py."""

from __future__ import annotations

from .repro_areal_sweep import sweep_bodies

__all__ = ["areal_bodies"]

_SILENT_AREAL = """\
import warnings  # noqa: E402

warnings.simplefilter("error")  # a warning about the setting would end the script: accepted silently only
"""

# AReaL's utils/data.py imports its infrastructure: the two classes are executed from the installed file
_AREAL_DATA = """\
import ast  # noqa: E402

import numpy as np  # noqa: E402  (data.py's own)
import torch.distributed as dist  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("areal").submodule_search_locations)))
source = (root / "utils" / "data.py").read_text()
data = {"torch": torch, "np": np, "dist": dist, "NormConfig": object}  # NormConfig: an annotation only
for node in ast.parse(source).body:  # the classes' code as installed (decorators included), nothing else
    if isinstance(node, ast.ClassDef) and node.name in ("Normalization", "KLEstimator"):
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(root / "utils" / "data.py"), "exec"), data)


def norm(**config):
    return data["Normalization"](types.SimpleNamespace(**{"mean_leave1out": False, "std_unbiased": True,
                                                           "eps": 1e-5, **config}))


# two responses of one group, rewards (1, 0), of 3 and 1 tokens: per-token advantages with the loss mask
x = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
"""


# AReaL's trainer/ppo/actor.py imports its whole stack: the ``def``s a script runs are parsed from the
# installed file (``actor_def``), with the defaults of PPOActorConfig read from api/cli_args.py
# (``config_defaults``) and a stand-in actor holding what ``PPOActor.__init__`` (actor.py:44-66) copies
_AREAL_ACTOR = _AREAL_DATA + """\
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402  (actor.py's annotations)

actor_source = (root / "trainer" / "ppo" / "actor.py").read_text()


def actor_def(name, **names):
    \"\"\"actor.py's function ``name`` (``Class.method``: a method), run with ``names``.\"\"\"
    owner, _, name = name.rpartition(".")
    body = ast.parse(actor_source).body
    if owner:
        body = next(node for node in body if isinstance(node, ast.ClassDef) and node.name == owner).body
    node = next(node for node in body if isinstance(node, ast.FunctionDef) and node.name == name)
    namespace = {"torch": torch, "Any": Any, **names}
    path = str(root / "trainer" / "ppo" / "actor.py")
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def config_defaults(cls):
    \"\"\"The literal ``field(default=...)`` values of the dataclass ``cls`` in api/cli_args.py.\"\"\"
    tree = ast.parse((root / "api" / "cli_args.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.value, ast.Call):
            for keyword in item.value.keywords:
                if keyword.arg == "default" and isinstance(keyword.value, ast.Constant):
                    out[item.target.id] = keyword.value.value
    return out


def actor(**overrides):
    config = SimpleNamespace(**{**config_defaults("PPOActorConfig"), **overrides})
    return SimpleNamespace(config=config, reward_bias=config.reward_bias,
                           reward_scaling=config.reward_scaling, reward_clip=config.reward_clip,
                           kl_ctl=config.kl_ctl, kl_estimator=data["KLEstimator"](config.kl_estimator),
                           adv_norm=None, reward_norm=None, discount=config.discount,
                           gae_lambda=config.gae_lambda, mask_no_eos_with_zero=config.mask_no_eos_with_zero)


def rollout(rows, rewards, logp=-2.0):
    \"\"\"(prompt length, response length) per row, right-padded to the longest row.\"\"\"
    width = max(p + r for p, r in rows)
    att, lm, lp = (torch.zeros(len(rows), width, dtype=d) for d in (torch.long, torch.long, torch.float32))
    for i, (p, r) in enumerate(rows):
        att[i, : p + r], lm[i, p : p + r], lp[i, p : p + r] = 1, 1, logp
    return {"input_ids": torch.ones_like(att), "attention_mask": att, "loss_mask": lm,
            "logprobs": lp, "rewards": torch.tensor(rewards, dtype=torch.float32)}


compute_advantages = actor_def("PPOActor._compute_advantages", reward_overlong_penalty=None)
"""


def areal_bodies(areal: str) -> dict[tuple[str, str], str]:
    """AReaL's later findings' script bodies; ``areal``: repro_bodies.py's preamble for functional.py."""
    _AREAL = areal
    return {
        ("areal", "behavior_weight"): _AREAL + """\
logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
prox = torch.tensor([[-1.0, -1.0]])  # pi_prox, recomputed: the ratio is 1
behave = torch.tensor([[-1.5, -0.7]])  # the rollout's log-probs: w = pi_prox / pi_behave = e^0.5, e^-0.3
loss, _ = functional.ppo_actor_loss_fn(logp, prox, behave, torch.ones(1, 2), 0.2, torch.ones(1, 2).bool(),
                                       rejection_sampling=None)  # use_decoupled_loss=True, the default None
grad = torch.autograd.grad(loss, logp)[0][0].tolist()
exact = (-torch.exp(prox - behave)[0] / 2).tolist()
verdict("AReaL ppo_actor_loss_fn, decoupled (proximal != behaviour log-probs), rejection_sampling=None "
        "(utils/functional/functional.py:535): d loss / d logp, A = 1", grad,
        f"{exact} (the decoupled loss: -w A / 2, w = pi_prox / pi_behave)", abs(grad[0] + 0.5) < 1e-7)
""",
        ("areal", "kl_reward_no_reference"): _AREAL_ACTOR + """\
defaults = config_defaults("PPOActorConfig")
ref = config_defaults("PPOConfig").get("ref")
out = compute_advantages(actor(), rollout([(2, 3)], [0.0]))  # no "ref_logp": no reference model
got = [round(v, 6) for v in out["advantages"][0].tolist()]
verdict(f"AReaL PPOActor._compute_advantages (trainer/ppo/actor.py:194) with the defaults kl_ctl "
        f"{defaults['kl_ctl']}, kl_estimator {defaults['kl_estimator']!r}, ref {ref}: a response of 3 tokens "
        "at log pi = -2, task reward 0: the advantages", got,
        "[0.0, 0.0, 0.0, 0.0, 0.0] (no reference model, no KL term: only the task reward)",
        max(abs(v) for v in got) > 0.1)
""",
        ("areal", "eos_by_width"): _AREAL_ACTOR + """\
# row 0: prompt 2, a response of 4 tokens that ends with EOS (the batch's longest row);
# row 1: prompt 1, a response of 3 tokens cut by the length budget (no EOS); both rewarded 1
out = compute_advantages(actor(kl_ctl=0.0, mask_no_eos_with_zero=True),
                         rollout([(2, 4), (1, 3)], [1.0, 1.0]))
got = [out["advantages"][0, 1].item(), out["advantages"][1, 0].item()]
verdict("AReaL PPOActor._compute_advantages (trainer/ppo/actor.py:201), mask_no_eos_with_zero=True: the "
        "advantage of [the finished longest row, the truncated shorter row]", got,
        "[1.0, 0.0] (only the truncated response loses its reward)", got == [0.0, 1.0])
""",
        ("areal", "m2po_normalizer"): _AREAL_ACTOR + _AREAL + """\
m2po = actor_def("_apply_m2po_masking", _get_m2po_loss_mask=actor_def("_get_m2po_loss_mask"))
# a step of two micro-batches of 2 tokens, A = 1, ratio 1; in the first, one token's behaviour log-prob is
# 2 nats off (second moment 4 > m2_threshold 1): M2PO masks it
old = [torch.tensor([[-3.0, -1.0]]), torch.tensor([[-1.0, -1.0]])]
total = 4  # the engine's total_loss_weight: loss_mask.count_nonzero() summed over the step (actor.py:363)
grads = []
for behave in old:
    logp = torch.full((1, 2), -1.0, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    kept = m2po(behave, logp.detach(), mask, 1.0)  # grpo_loss_fn, actor.py:448
    loss, _ = functional.ppo_actor_loss_fn(logp, logp.detach(), behave, torch.ones(1, 2), 0.2, kept)
    scale = int(mask.count_nonzero()) / total  # fsdp_engine.py:2120: local_weight / total_loss_weight
    grad = torch.autograd.grad(loss * scale, logp)[0][0]
    grads.append([round(g, 6) for g, k in zip(grad.tolist(), kept[0].tolist()) if k])
verdict("AReaL grpo_loss_fn with m2_threshold=1 (trainer/ppo/actor.py:448), two micro-batches weighted by "
        "the engine: d loss / d logp of the kept tokens of each", grads,
        "one weight for every kept token (-1/3 each: a mean over the 3 kept tokens)",
        grads == [[-0.5], [-0.25, -0.25]])
""",
        ("areal", "config:eps_clip"): _SILENT_AREAL + _AREAL + """\
logp = torch.tensor([[-1.0]], requires_grad=True)  # ratio 1, A = 1
loss, _ = functional.ppo_actor_loss_fn(logp, logp.detach(), logp.detach(), torch.ones(1, 1), 0.2,
                                       torch.ones(1, 1).bool(), eps_clip_higher=-0.3)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("AReaL ppo_actor_loss_fn(eps_clip=0.2, eps_clip_higher=-0.3) (utils/functional/functional.py:518: "
        "the band [0.8, 0.7]): accepted; d loss / d logp of an on-policy token with A = 1", grad,
        "-1.0 (an on-policy token is inside any clip band)", grad == 0.0)
""",
        ("areal", "adv_weighting"): _AREAL_DATA + """\
out = norm(mean_level="group", std_level=None, group_size=2)(x, mask)
got = [round(out[0, 0].item(), 6), round(out[1, 0].item(), 6)]
verdict("AReaL Normalization(mean_level='group', std_level=None) on per-token advantages with the loss mask "
        "(utils/data.py:1520), T = (3, 1), R = (1, 0): the advantages", got,
        "[0.5, -0.5] (R minus the mean of the group's responses)", got == [0.25, -0.75])
""",
        ("areal", "adv_leave_one_out_unit"): _AREAL_DATA + """\
out = norm(mean_level="group", mean_leave1out=True, std_level=None, group_size=2)(x, mask)
got = [round(out[0, 0].item(), 6), round(out[1, 0].item(), 6)]
verdict("AReaL Normalization(mean_level='group', mean_leave1out=True) on per-token advantages "
        "(utils/data.py:1541), T = (3, 1), R = (1, 0): the advantages", got,
        "[1.0, -1.0] (R minus the other response's reward)", got == [0.333333, -1.0])
""",
        ("areal", "adv_trailing_partial"): _AREAL_DATA + """\
rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])  # two groups of 2 and a trailing group of 1
got = norm(mean_level="group", std_level="group", group_size=2)(rewards).tolist()
verdict("AReaL Normalization(mean_level='group', std_level='group', group_size=2, eps=1e-5) "
        "(utils/data.py:1424) on 5 rewards: the trailing sample's advantage", got[-1],
        "0, an error or R (a group of one has no baseline), never R / eps", got[-1] > 9e4)
""",
        ("areal", "kl_reward_value_clamp"): _AREAL_DATA + """\
kl = data["KLEstimator"]("k1")(torch.tensor([0.0]), torch.tensor([-12.0])).item()
verdict("AReaL KLEstimator('k1') (utils/data.py:1655), log pi - log pi_ref = 12: the estimate the KL reward "
        "uses", kl, "12.0 (k1 = log pi - log pi_ref)", kl == 10.0)
""",
        ("areal", "whiten_one_pass_dtype"): _AREAL + """\
x = torch.tensor([1e8 + 1.0, 1e8 - 1.0, 1e8 + 1.0, 1e8 - 1.0], dtype=torch.float64)  # mean 1e8, std 1
got = functional.masked_normalization(x, eps=0.0, all_reduce=False).tolist()
verdict("AReaL masked_normalization (utils/functional/functional.py:50), float64 x = 1e8 +- 1, eps 0: the "
        "whitened values", got, "[1.0, -1.0, 1.0, -1.0] (two-pass variance 1)",
        all(abs(v) == float("inf") for v in got))
""",
        ("areal", "overlong_floor"): _AREAL + """\
data = {"rewards": torch.zeros(1), "input_ids": torch.zeros(1, 30, dtype=torch.long),
        "loss_mask": torch.ones(1, 30)}  # one response of 30 tokens
got = functional.reward_overlong_penalty(data, overlong_tokens=5, overlong_penalty_factor=1.0,
                                         max_response_length=20)["rewards"].item()
verdict("AReaL reward_overlong_penalty (utils/functional/functional.py:797), a 30-token response, "
        "max_response_length 20, overlong_tokens 5, factor 1: the penalty", got,
        "-1.0 (DAPO: -1 beyond the budget)", got == -3.0)
""",
        ("areal", "fixed_aggregation"): _AREAL + """\
logp = torch.zeros(2, 3, requires_grad=True)  # rows of 3 and 1 tokens, A = 1, ratio 1
mask = torch.tensor([[True, True, True], [True, False, False]])
adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
loss, _ = functional.ppo_actor_loss_fn(logp, torch.zeros(2, 3), torch.zeros(2, 3), adv, 3e-4, mask,
                                       eps_clip_higher=4e-4, importance_sampling_level="sequence")
grad = torch.autograd.grad(loss, logp)[0]
got = [round(grad[0, 0].item(), 6), round(grad[1, 0].item(), 6)]
verdict("AReaL ppo_actor_loss_fn(importance_sampling_level='sequence') (GSPO, "
        "utils/functional/functional.py:542), T = (3, 1): d loss / d logp of each row's first token", got,
        "[-0.166667, -0.5] (GSPO's seq_mean: -A / (N T_i))", got == [-0.25, -0.25])
""",
        **_audit_bodies(_AREAL),
    }


# AReaL's utils/constants.py (enums and constants only) and trainer/ppo/stats.py (torch only) as installed,
# for grpo_loss_fn; its stats_tracker calls only log, so a stand-in records nothing
_AREAL_LOSS_FN = """\
def load(relative, name):
    spec = importlib.util.spec_from_file_location(name, root / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


constants = load("utils/constants.py", "_repro_areal_constants")
stats = load("trainer/ppo/stats.py", "_repro_areal_stats")
logging_only = SimpleNamespace(denominator=lambda **k: None, stat=lambda **k: None, scalar=lambda **k: None)
names = {k: getattr(constants, k) for k in dir(constants) if k.startswith(("PROX_", "ProxLogp"))}
grpo_loss_fn = actor_def(
    "grpo_loss_fn", RejectionSamplingConfig=object, ppo_actor_loss_fn=functional.ppo_actor_loss_fn,
    sapo_loss_fn=functional.sapo_loss_fn, stats_tracker=logging_only,
    infer_token_denominator=stats.infer_token_denominator,
    _resolve_proximal_logp=actor_def("_resolve_proximal_logp", **names),
    _log_proximal_approximation_stats=lambda **k: None, **names)
"""

# NormConfig.__post_init__ as installed (api/cli_args.py), run on a stand-in holding the fields it reads
_NORM_CONFIG = """\
cli_path = root / "api" / "cli_args.py"
norm_class = next(n for n in ast.parse(cli_path.read_text()).body
                  if isinstance(n, ast.ClassDef) and n.name == "NormConfig")
post_init = next(n for n in norm_class.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
checked = {}
exec(compile(ast.Module(body=[post_init], type_ignores=[]), str(cli_path), "exec"), checked)
"""


def _audit_bodies(_AREAL: str) -> dict[tuple[str, str], str]:
    """The scripts of the findings of issue 27's audit (areal_findings.AUDIT_FINDINGS)."""
    return {
        ("areal", "reward_last_trainable"): _AREAL_ACTOR + """\
# prompt 1 token, then 2 generated tokens (loss mask 1) and a 2-token environment turn (loss mask 0) last
batch = {"input_ids": torch.ones(1, 5, dtype=torch.long),
         "attention_mask": torch.ones(1, 5, dtype=torch.long), "loss_mask": torch.tensor([[0, 1, 1, 0, 0]]),
         "logprobs": torch.tensor([[0.0, -2.0, -2.0, 0.0, 0.0]]), "rewards": torch.tensor([1.0])}
out = compute_advantages(actor(kl_ctl=0.0), batch)
got = [round(v, 6) for v in out["advantages"][0].tolist()]
verdict("AReaL PPOActor._compute_advantages (trainer/ppo/actor.py:206), a trajectory ending with a "
        "non-trainable turn, task reward 1, kl_ctl 0, discount = gae_lambda = 1: the advantages", got,
        "1.0 at the two generated tokens (rolled positions 0 and 1): the reward of the last action",
        max(abs(v) for v in got) == 0.0)
""",
        ("areal", "rejection_kl_metric"): _AREAL_DATA + _AREAL + """\
functional.KLEstimator = data["KLEstimator"]  # functional.py's own import: the class of utils/data.py
prox = torch.tensor([[-0.1, -3.0]])  # pi_prox
behave = torch.tensor([[-2.0, -0.2]])  # pi_behave (the rollout): r = pi_prox / pi_behave = 6.69, 0.061
config = types.SimpleNamespace(level="token", action="mask", metric="kl_k3", agg="mean", upper=2.0,
                               lower=None)
got = functional.apply_rejection_sampling(prox, behave, torch.ones(1, 2), None, config).loss_mask
got = got.bool()[0].tolist()
r = torch.exp(prox - behave)[0]
k3 = r - torch.log(r) - 1
verdict("AReaL apply_rejection_sampling(metric='kl_k3', upper=2) (utils/functional/functional.py:242): "
        "the tokens kept", got, f"{(k3 <= 2).tolist()} (the help's k3 = r - log(r) - 1 = "
        f"{[round(v, 3) for v in k3.tolist()]})", got == [True, False])
""",
        ("areal", "rejection_nonfinite_weight"): _AREAL + """\
prox = torch.tensor([[-1.0, -1.0]])
behave = torch.tensor([[-1.0, -float("inf")]])  # the second token: pi_behave = 0, w = +inf
config = types.SimpleNamespace(level="token", action="mask", metric="ratio", agg="mean", upper=5.0,
                               lower=None)
res = functional.apply_rejection_sampling(prox, behave, torch.ones(1, 2), None, config)
got = [res.loss_mask[0, 1].item(), res.behave_imp_weight[0, 1].item()]
verdict("AReaL apply_rejection_sampling(metric='ratio', action='mask', upper=5) "
        "(utils/functional/functional.py:233), a token with behaviour log-prob -inf: [loss mask, weight]",
        got, "[0.0, ...] (w = +inf > 5: rejected)", got == [1.0, 1.0])
""",
        ("areal", "adv_leave_one_out_std"): _AREAL_DATA + """\
rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])  # one group of 4
got = norm(mean_level="group", mean_leave1out=True, std_level="group", group_size=4, eps=0.0)(rewards)
got = [round(v, 6) for v in got.tolist()]
exact = [round(v, 6) for v in (4 / 3 * (rewards - rewards.mean()) / rewards.std()).tolist()]
verdict("AReaL Normalization(mean_level='group', mean_leave1out=True, std_level='group', eps=0) "
        "(utils/data.py:1472) on rewards (1, 0, 0, 0): the advantages", got,
        f"{exact} (RLOO's centring over the sample std of the rewards)", got == [1.5, -0.5, -0.5, -0.5])
""",
        ("areal", "adv_std_uncentred"): _AREAL_DATA + """\
rewards = torch.tensor([1.0, 2.0, 3.0])
got = [round(v, 6) for v in norm(mean_level=None, std_level="batch", group_size=1, eps=0.0)(rewards).tolist()]
verdict("AReaL Normalization(mean_level=None, std_level='batch', eps=0) (utils/data.py:1445) on rewards "
        "(1, 2, 3): the scaled rewards", got, "[1.0, 2.0, 3.0] (x / std, the sample std 1)",
        got == [0.377964, 0.755929, 1.133893])
""",
        ("areal", "distill_k1_loss"): _AREAL_ACTOR + _AREAL + _AREAL_LOSS_FN + """\
z = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)  # the policy's logits at one state
teacher = torch.log_softmax(torch.tensor([2.0, -1.0, 0.0]), 0)
pi = torch.softmax(z.detach(), 0)
expected_grad = torch.zeros(3)
for a in range(3):  # every sampled token, weighted by its probability: the expected gradient
    logp = torch.log_softmax(z, 0)[a].reshape(1, 1)
    batch = {"logprobs": logp.detach(), "advantages": torch.zeros(1, 1), "loss_mask": torch.ones(1, 1),
             "prox_logp": logp.detach(), "teacher_logp": teacher[a].reshape(1, 1), "distill_loss_weight": 1.0}
    loss = grpo_loss_fn(logp, torch.zeros(1, 1), batch, eps_clip=0.2, eps_clip_higher=None, c_clip=None)
    expected_grad += pi[a] * torch.autograd.grad(loss, z)[0]
q = torch.softmax(z, 0)
exact = torch.autograd.grad((q * (torch.log(q) - teacher)).sum(), z)[0]
got = [round(v, 6) for v in expected_grad.tolist()]
verdict("AReaL grpo_loss_fn with teacher_logp, rl_loss_weight 1 (trainer/ppo/actor.py:507), A = 0: "
        "E[d loss / d logits] over the sampled token", got,
        f"{[round(v, 6) for v in exact.tolist()]} (grad KL(pi || teacher))", max(abs(v) for v in got) < 1e-6)
""",
        ("areal", "config:group_size"): _SILENT_AREAL + _AREAL_ACTOR + _NORM_CONFIG + """\
size = config_defaults("NormConfig")["group_size"]
checked["__post_init__"](SimpleNamespace(mean_level="group", std_level="group", group_size=size))  # passes
got = norm(mean_level="group", std_level="group", group_size=size)(torch.tensor([1.0, 0.0, 1.0, 0.0]))
got = got.tolist()
rewards = torch.tensor([1.0, 0.0, 1.0, 0.5])  # one group of gconfig.n_samples = 4
checked["__post_init__"](SimpleNamespace(mean_level="group", std_level="group", group_size=2))  # passes
half = norm(mean_level="group", std_level="group", group_size=2, eps=0.0)(rewards)
half = [round(v, 3) for v in half.tolist()]
full = [round(v, 3) for v in ((rewards - rewards.mean()) / rewards.std()).tolist()]
verdict(f"AReaL NormConfig(mean_level='group', std_level='group') with its default group_size {size} "
        "(api/cli_args.py:93): accepted; Normalization on rewards (1, 0, 1, 0); then group_size 2 for a "
        "group of n_samples 4, rewards (1, 0, 1, 0.5), eps 0: accepted", [got, half],
        f"an error (a group of one has no baseline), or the group the rewards were sampled in: {full}",
        size == 1 and got == [0.0, 0.0, 0.0, 0.0] and half != full)
""",
        ("areal", "config:overlong_tokens"): _SILENT_AREAL + _AREAL + """\
data = {"rewards": torch.zeros(1), "input_ids": torch.zeros(1, 20, dtype=torch.long),
        "loss_mask": torch.ones(1, 20)}  # a response of exactly max_new_tokens = 20 tokens
got = functional.reward_overlong_penalty(data, overlong_tokens=0, overlong_penalty_factor=1.0,
                                         max_response_length=20)["rewards"].item()
verdict("AReaL reward_overlong_penalty(overlong_tokens=0) (utils/functional/functional.py:798), "
        "L = max_new_tokens = 20: accepted; the reward", got,
        "an error (advantages.md eq. (8) needs L_cache > 0)", got != got)
""",
        ("areal", "config:m2_threshold"): _SILENT_AREAL + _AREAL_ACTOR + """\
mask = actor_def("_get_m2po_loss_mask")(torch.tensor([3.0, 2.0, 1.0, 0.5]), 0.0)  # sorted second moments
got = mask.tolist()
verdict("AReaL _get_m2po_loss_mask(m2_threshold=0) (trainer/ppo/actor.py:841): accepted; the tokens kept",
        got, "an error (a mean of squares is never below 0)", got == [False, False, False, True])
""",
        **_second_audit_bodies(_AREAL),
    }


def _second_audit_bodies(_AREAL: str) -> dict[tuple[str, str], str]:
    """The scripts of a second audit's findings (the end of areal_findings.AUDIT_FINDINGS)."""
    return {
        ("areal", "mask_no_eos_reward_only"): _AREAL_ACTOR + """\
stand_in = actor(kl_ctl=0.0, mask_no_eos_with_zero=True)
stand_in.reward_norm = norm(mean_level="group", std_level="group", group_size=2)  # GRPO's group std
# one group: row 0 (prompt 2, 4 tokens) cut by the budget, no EOS (the longest row: AReaL's own test,
# finding eos_by_width, takes it for truncated too), reward 1; row 1 (prompt 1, 2 tokens) ends with EOS, 0
out = compute_advantages(stand_in, rollout([(2, 4), (1, 2)], [1.0, 0.0]))
got = [int(out["loss_mask"][0].sum().item()), round(out["advantages"][0].abs().max().item(), 6),
       round(out["advantages"][1, 0].item(), 6)]
verdict("AReaL PPOActor._compute_advantages (trainer/ppo/actor.py:209), mask_no_eos_with_zero=True, "
        "reward_norm by group: [trained tokens of the truncated row, its largest |advantage|, the finished "
        "row's advantage]", got,
        "[0, ..., ...] (advantages.md eq. (9): every token of the truncated sample leaves the loss, and its "
        "reward leaves its group's baseline)", got[0] == 4 and got[1] == 0.0 and abs(got[2] + 0.707) < 1e-3)
""",
        ("areal", "config:max_new_tokens"): _SILENT_AREAL + _AREAL_ACTOR + _AREAL + """\
budget = config_defaults("PPOActorConfig")["max_new_tokens"]  # the penalty's L_max (actor.py:163)
rollout_budget = config_defaults("GenerationHyperparameters")["max_new_tokens"]  # the generation limit
penalised = actor_def("PPOActor._compute_advantages",
                      reward_overlong_penalty=functional.reward_overlong_penalty)
stand_in = actor(kl_ctl=0.0, overlong_reward_penalty=True, overlong_tokens=64, overlong_penalty_factor=1.0)
out = penalised(stand_in, rollout([(1, 1100)], [0.0]))  # a 1100-token response, task reward 0
got = round(out["advantages"][0, 0].item(), 6)
verdict(f"AReaL PPOActor._compute_advantages with overlong_reward_penalty (trainer/ppo/actor.py:163), "
        f"overlong_tokens 64, factor 1, the defaults actor.max_new_tokens {budget} and "
        f"gconfig.max_new_tokens {rollout_budget}: accepted; the advantage of a 1100-token response", got,
        f"0.0 (advantages.md eq. (8) with L_max = the generation budget {rollout_budget})",
        budget < 1100 <= rollout_budget - 64 and got < -1.0)
""",
        ("areal", "config:m2_threshold_coupled"): _SILENT_AREAL + _AREAL_ACTOR + """\
m2po = actor_def("_apply_m2po_masking", _get_m2po_loss_mask=actor_def("_get_m2po_loss_mask"))
batch = rollout([(1, 3)], [1.0])  # the rollout's (behaviour) log-probs, -2 on 3 response tokens
behave = torch.roll(batch["logprobs"], shifts=-1, dims=-1)  # in the recomputed log-probs' layout
prox = behave.clone()
prox[0, 1] -= 3.0  # the trainer's recomputed log-prob of one token is 3 nats away
mask = torch.roll(batch["loss_mask"], shifts=-1, dims=-1).bool()
exact = m2po(behave, prox.clone(), mask, 1.0)[mask].tolist()  # M2PO's rule on the two log-probs
batch["prox_logp"] = prox
out = compute_advantages(actor(kl_ctl=0.0, recompute_logprob=True), batch)  # use_decoupled_loss False
# grpo_loss_fn (actor.py:432, 448) masks with input_data["logprobs"] and input_data["prox_logp"]
got = m2po(out["logprobs"], out["prox_logp"], out["loss_mask"].bool(), 1.0)[mask].tolist()
verdict("AReaL M2PO (trainer/ppo/actor.py:448) with m2_threshold 1 and use_decoupled_loss=False "
        "(actor.py:186-191): accepted; the tokens kept", got,
        f"{exact} (the token 3 nats off, second moment 9, masked) or an error", got == [True, True, True]
        and exact == [True, False, True])
""",
        ("areal", "config:critic_mask_no_eos"): _SILENT_AREAL + _AREAL_DATA + """\
critic_path = root / "trainer" / "ppo" / "critic.py"
tree = ast.parse(critic_path.read_text())
uses = sorted(n.lineno for n in ast.walk(tree)
              if isinstance(n, ast.Attribute) and n.attr == "mask_no_eos_with_zero")
logged = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") ==
          "scalars"]  # scalars = dict(...), passed to stats_tracker.scalar(**scalars) only
inside = [any(a.lineno <= line <= a.end_lineno for a in logged) for line in uses]
verdict("AReaL PPOCritic (trainer/ppo/critic.py:50): the lines that read config.mask_no_eos_with_zero, and "
        "whether each is inside the logged scalars", [uses, inside],
        "a use that changes the critic's targets or loss mask (or an error: the actor's setting decides)",
        bool(uses) and all(inside))
""",
        **_third_audit_bodies(_AREAL),
    }


def _third_audit_bodies(_AREAL: str) -> dict[tuple[str, str], str]:
    """The scripts of a third audit's validation findings (the end of areal_findings.AUDIT_FINDINGS)."""
    return {
        ("areal", "config:sapo_ignores_clip"): _SILENT_AREAL + _AREAL_ACTOR + _AREAL + _AREAL_LOSS_FN
        + """\
cli_path = root / "api" / "cli_args.py"
config_class = next(n for n in ast.parse(cli_path.read_text()).body
                    if isinstance(n, ast.ClassDef) and n.name == "PPOActorConfig")
post_init = next(n for n in config_class.body
                 if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
sapo_check = next(n for n in ast.walk(post_init)
                  if isinstance(n, ast.If) and ast.unparse(n.test) == "self.use_sapo_loss")
read = sorted({n.attr for n in ast.walk(sapo_check) if isinstance(n, ast.Attribute)} - {"use_sapo_loss"})


def sapo(**clip):  # A < 0 at ratio 2 (log-ratio 0.7 against the old log-prob 0)
    logp = torch.tensor([[0.7]], requires_grad=True)
    batch = {"logprobs": torch.zeros(1, 1), "advantages": torch.tensor([[-1.0]]),
             "loss_mask": torch.ones(1, 1), "prox_logp": torch.zeros(1, 1)}
    loss = grpo_loss_fn(logp, torch.zeros(1, 1), batch, use_sapo_loss=True, **clip)
    return [round(loss.item(), 6), round(torch.autograd.grad(loss, logp)[0].item(), 6)]


got = [sapo(eps_clip=0.2, eps_clip_higher=None, c_clip=None),
       sapo(eps_clip=0.01, eps_clip_higher=0.02, c_clip=1.5)]
verdict(f"AReaL PPOActorConfig.__post_init__'s SAPO check (api/cli_args.py:1637) reads {read}; "
        "grpo_loss_fn(use_sapo_loss=True) [loss, gradient] with the default clip and with eps_clip 0.01, "
        "eps_clip_higher 0.02, c_clip 1.5", got,
        "an error or a warning (the clip settings do nothing for SAPO)",
        got[0] == got[1] and not {"eps_clip", "eps_clip_higher", "c_clip"} & set(read))
""",
        ("areal", "config:rejection_sampling_lower"): _SILENT_AREAL + _AREAL_ACTOR + _AREAL
        + _AREAL_LOSS_FN + """\
cli_path = root / "api" / "cli_args.py"
config_class = next(n for n in ast.parse(cli_path.read_text()).body
                    if isinstance(n, ast.ClassDef) and n.name == "RejectionSamplingConfig")
post_init = next(n for n in config_class.body
                 if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
checked = {}
exec(compile(ast.Module(body=[post_init], type_ignores=[]), str(cli_path), "exec"), checked)
config = SimpleNamespace(level="token", action="mask", metric="ratio", agg="mean", upper=2.0, lower=1.5)
checked["__post_init__"](config)  # passes: lower > 0 and lower <= upper are all it asks
logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
batch = {"logprobs": logp.detach().clone(), "advantages": torch.tensor([[1.0, -1.0]]),
         "loss_mask": torch.ones(1, 2), "prox_logp": logp.detach().clone()}  # coupled: prox = old
loss = grpo_loss_fn(logp, torch.zeros(1, 2), batch, eps_clip=0.2, eps_clip_higher=None, c_clip=None,
                    rejection_sampling=config, use_decoupled_loss=False)
grad = torch.autograd.grad(loss, logp)[0][0].tolist()
verdict("AReaL RejectionSamplingConfig(metric='ratio', lower=1.5, upper=2) (api/cli_args.py:1421): accepted; "
        "grpo_loss_fn with use_decoupled_loss=False (the warning: 'Filtering will be ignored'), on-policy "
        "tokens, A = (1, -1): d loss / d logp", grad,
        "[-0.5, 0.5] (the filter ignored as the warning says; a band without ratio 1 an error)",
        grad == [0.0, 0.0])
""",
        **sweep_bodies(_AREAL, _AREAL_ACTOR, _NORM_CONFIG, _SILENT_AREAL, _AREAL_LOSS_FN),  # a sweep's
    }
