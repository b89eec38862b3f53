"""The SkyRL drivers' standalone reproductions beyond repro_bodies.py's first ones (findings built in
skyrl_common.py): ``skyrl_bodies(overflow_case, silent)`` returns them keyed as ``BODIES``, given
repro_bodies.py's shared float32 overflow case and its warnings-as-errors preamble."""

from __future__ import annotations

__all__ = ["skyrl_bodies"]

#: SkyRL-train 0.3.1's ppo_utils.py and its shipped trainer.algorithm config
_TRAIN = """\
from omegaconf import OmegaConf, open_dict  # noqa: E402  (SkyRL's own config library)

stand_ins("ray", ray__is_initialized=lambda: False)  # SkyRL's registries ask ray whether it runs
ppo = load_file("skyrl_train", "utils/ppo_utils.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("skyrl_train").submodule_search_locations)))
config = OmegaConf.load(root / "config" / "ppo_base_config.yaml").trainer.algorithm  # the shipped defaults
with open_dict(config):
    config.max_seq_len = None
    config.loss_reduction = "token_mean"
"""
#: skyrl 0.4.0's ppo_utils.py (its siblings and the typed AlgorithmConfig, defaults) without __init__
_PKG = """\
stand_ins("ray", "skyrl_gym", ray__is_initialized=lambda: False)  # ray: registries; skyrl_gym: env configs
bare_packages("skyrl", "backends", "backends.skyrl_train", "backends.skyrl_train.utils", "train")
ppo = importlib.import_module("skyrl.backends.skyrl_train.utils.ppo_utils")
config = ppo.AlgorithmConfig()  # the release's defaults
"""
# an A < 0 token at r = 1, inside the clip band [0.8, 1.2]; the dual clip c = 0.5 caps it there
_DUAL = """\
config.policy_loss_type, config.clip_ratio_c = "dual_clip", 0.5  # accepted: no error, no warning
old = torch.tensor([[-1.0]])
logp = torch.tensor([[-1.0]], requires_grad=True)
adv, one = torch.tensor([[-1.0]]), torch.ones(1, 1)
grad = torch.autograd.grad(ppo.ppo_policy_loss(logp, old, adv, config, loss_mask=one)[0], logp)[0].item()
"""


def _dual_verdict(where: str) -> str:
    return f"""\
verdict("{where} with clip_ratio_c = 0.5: accepted; d loss / d logp of an A < 0 token at r = 1 (inside "
        "the clip band)", f"{{grad}} (the dual clip caps it inside the band)",
        "1.0 (-A r; c must exceed 1 + eps_clip_high)", grad == 0.0)
"""


def skyrl_bodies(overflow_case: str, silent: str) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("skyrl", "ratio_overflow"): _TRAIN + overflow_case + """\
config.policy_loss_type = "clip_cov"  # the shipped clip_cov_lb / clip_cov_ub: equal advantages, cov 0
loss = ppo.compute_policy_loss_clip_cov(logp, old, adv.expand(1, 2), config, loss_mask=mask)[0]
grad = torch.autograd.grad(loss, logp)[0]
verdict("SkyRL compute_policy_loss_clip_cov (utils/ppo_utils.py:776), float32 log-ratio 95 under a closed "
        "gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW, bool(torch.isnan(grad[0, 0])))
""",
        ("skyrl", "config:clip_ratio_c"): silent + _TRAIN + _DUAL
        + _dual_verdict("SkyRL ppo_policy_loss (utils/ppo_utils.py:580)"),
        ("skyrl", "config:max_seq_len"): silent + _TRAIN + """\
per_token = torch.ones(1, 4)  # a response of 4 tokens, each token's loss 1; max_seq_len 2
value = ppo.reduce_loss(per_token, torch.ones(1, 4), "seq_mean_token_sum_norm", max_seq_len=2).item()
verdict("SkyRL reduce_loss (utils/ppo_utils.py:899), seq_mean_token_sum_norm, a 4-token response with "
        "max_seq_len = 2: accepted", f"{value} (no error, no warning)",
        "an error: Dr. GRPO's constant must bound every length (the row weighs 4 / 2 = 2, more than 1)",
        value == 2.0)
""",
        ("skyrl_pkg", "config:maxrl_rewards"): silent + _PKG + """\
rewards = torch.tensor([[-1.0], [0.5]])  # one group, -1 / +0.5 rewards: the group mean is -0.25
adv = ppo.compute_maxrl_advantage(rewards, torch.ones(2, 1), index=["g", "g"])[0][:, 0].tolist()
verdict("skyrl compute_maxrl_advantage (backends/skyrl_train/utils/ppo_utils.py:1423), rewards -1 and 0.5 "
        "in one group: accepted; the advantages", f"{adv} (no error, no warning)",
        "an error: MaxRL's mean is a pass rate (binary rewards); here the better response gets the "
        "negative advantage", adv[1] < 0 < adv[0])
""",
        ("skyrl_pkg", "kl_value_clamp"): _PKG + """\
logp = torch.tensor([0.0, 0.0], dtype=torch.float64, requires_grad=True)
ref = torch.tensor([2.0, 3.0], dtype=torch.float64)  # log(ref / pi) 2 and 3: k3 = 4.39 and 16.09
kl = ppo.compute_approx_kl(logp, ref, kl_estimator_type="k3")
grad = torch.autograd.grad(kl.sum(), logp)[0].tolist()
x = (ref - logp).detach()
exact = (1.0 - torch.exp(x)).tolist()  # d/d logp of k3 = exp(x) - x - 1, x = ref - logp
verdict("skyrl compute_approx_kl (backends/skyrl_train/utils/ppo_utils.py:118), k3: d KL / d logp",
        f"{grad} (values {kl.tolist()})", exact, grad[1] == 0.0 and grad[0] != 0.0)
""",
        ("skyrl_pkg", "clip_cov_scaled_advantages"): _PKG + """\
config.policy_loss_type = "clip_cov"  # the defaults: cov band (clip_cov_lb, clip_cov_ub) = (1, 5)
logp = torch.tensor([[0.0, -3.0], [-3.0, 0.0]])  # old = new (ratio 1: PPO's clip leaves every token)
adv, mask = torch.tensor([[2.0, 2.0], [-2.0, -2.0]]), torch.ones(2, 2)  # cov of (0, 0) and (1, 0): 3
# the advantages the trainer hands the loss (train/trainer.py:1527): divided by the token count
scaled = ppo.apply_loss_reduction_to_advantages_minibatch(adv, mask, "token_mean", 2, 2)
fraction = {}
for name, a in (("raw", adv), ("scaled", scaled)):
    out = ppo.compute_policy_loss_clip_cov(logp, logp, a, config, loss_mask=mask)
    fraction[name] = out[1]["clip_ratio"]
verdict("skyrl compute_policy_loss_clip_cov (backends/skyrl_train/utils/ppo_utils.py:976: the covariance "
        "against the absolute band (1, 5)) on the advantages RayPPOTrainer._normalize_advantages passes it, "
        "divided by the token count (token_mean): the fraction of tokens cov-clipped",
        fraction["scaled"],
        f"{fraction['raw']} (Clip-Cov on the raw advantages, as Cui et al. 2025 and verl)",
        fraction["scaled"] == 0.0 < fraction["raw"])
""",
        ("skyrl_pkg", "kl_cov_scaled_penalty"): _PKG + """\
config.policy_loss_type = "kl_cov"  # ppo_kl_coef 1.0 (the default)
config.kl_cov.kl_cov_frac = 1.0  # every token gets the penalty (the default 0.2: the top 20 %)
logp, old = torch.full((1, 4), 0.5), torch.zeros(1, 4)  # |log r| = 0.5 on 4 tokens
adv, mask = torch.zeros(1, 4), torch.ones(1, 4)  # A = 0: the loss is the penalty alone
# the advantages the trainer hands the loss (train/trainer.py:1527): divided by the token count
scaled = ppo.apply_loss_reduction_to_advantages_minibatch(adv, mask, "token_mean", 1, None)
loss = ppo.compute_policy_loss_kl_cov(logp, old, scaled, config, loss_mask=mask)[0].item()
verdict("skyrl compute_policy_loss_kl_cov (backends/skyrl_train/utils/ppo_utils.py:1024) on the "
        "advantages RayPPOTrainer._normalize_advantages passes it (token_mean), 4 tokens at |log r| = 0.5, "
        "A = 0: the loss",
        loss, "0.5 (the token mean of ppo_kl_coef * |log r|, as SkyRL-train 0.3.1's reduce_loss gives)",
        loss == 2.0)
""",
    }
