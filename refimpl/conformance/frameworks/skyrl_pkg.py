"""Driver for the installed ``skyrl`` package (0.4.0), the maintained successor of SkyRL-train: the
policy losses of its ``PolicyLossRegistry``, ``compute_approx_kl`` and the outcome advantage
estimators of its ``AdvantageEstimatorRegistry`` (skyrl/backends/skyrl_train/utils/ppo_utils.py),
called by the conformance kit beside SkyRL-train 0.3.1 (driver ``skyrl``).

How skyrl is imported. The package declares Python >= 3.12 and depends on ray, vllm, jax...; it is
installed with ``--no-deps --ignore-requires-python`` (its loss code runs on 3.11). Its package
``__init__`` chain imports the Tinker API (pydantic models) and fsspec, so the driver executes the
installed files it runs, unchanged, as private modules (``sources.load_source``): ``torch_utils.py``,
``off_policy_correction_utils.py``, ``skyrl/train/config/config.py`` (the typed ``AlgorithmConfig``
whose defaults the losses read) and ``ppo_utils.py``. Their absolute imports of one another are
served by those private modules while they load; ``ray`` (``@ray.remote`` and ``ray.is_initialized``
only) and ``skyrl_gym`` (two environment config classes the algorithm config never uses) are
import-only stand-ins, removed from ``sys.modules`` afterwards.

What a step does (skyrl 0.3.0 and later; skyrl/train/trainer.py ``RayPPOTrainer._normalize_advantages``
and workers/worker.py ``_forward_backward_micro``): the trainer scales every advantage with
``apply_loss_reduction_to_advantages_minibatch`` over the mini-batch (token_mean: / the mini-batch's
tokens; sequence_mean: / (rows x the row's tokens); seq_mean_token_sum_norm: / (rows x max_seq_len)),
each loss returns the masked **sum** of its per-token losses, and the KL loss
``masked_mean(kl, mask, dim=-1).mean() * kl_loss_coef`` is weighed by the micro-batch's share of the
rows (``microbatch_weight``). The adapter calls SkyRL's own scaling on the micro-batch and multiplies
by the micro-batch's share of the mini-batch's tokens (token_mean) or rows (the others): the factor
the mini-batch-wide call gives; that factor and the micro-batch weight are the only arithmetic here
that is not SkyRL's.

Releases: 0.2.0 has no ``skyrl/backends/skyrl_train`` (SkyRL-train's code moved in at 0.3.0), so the
driver runs 0.3.0 and later; ``RELEASE_FLAGS`` holds what 0.3.0 computes differently from 0.4.0.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from . import Mode, skyrl_common, skyrl_kinds
from .driver import distribution_version, find_mode
from .findings import Finding, dual_clip_tie_finding, zero_rows_finding
from .releases import release_modes
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
    stand_in,
    temporary_modules,
)
from .stubs import stubbed_imports

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "DISTRIBUTION",
    "MODES",
    "UNSUPPORTED",
    "PROFILE",
    "NOTES",
    "FINDINGS",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
    "STUBBED",
    "availability",
    "source_files",
    "algorithm_config",
    "config_keys",
    "target",
]

NAME = "skyrl_pkg"
PINNED_VERSION = "0.4.0"
DISTRIBUTION = "skyrl"
#: ppo_utils.py imports omegaconf, jaxtyping (with wadler-lindig) and loguru; config.py pyyaml
REQUIREMENTS = ("omegaconf==2.4.0", "loguru==0.7.3", "jaxtyping==0.3.11", "wadler-lindig==0.1.8")
#: skyrl declares Requires-Python >=3.12; its loss code runs on 3.11
INSTALL_OPTIONS = ("--ignore-requires-python",)
_PRIVATE = "_refimpl_skyrl_pkg"
_BACKEND = "backends/skyrl_train"
_SOURCES = (
    f"{_BACKEND}/utils/ppo_utils.py",
    f"{_BACKEND}/utils/torch_utils.py",
    f"{_BACKEND}/utils/off_policy_correction_utils.py",
    "train/config/config.py",
    f"{_BACKEND}/workers/worker.py",
    "train/trainer.py",
)
_INSTALL = "refimpl frameworks install skyrl_pkg"
STUBBED: list[str] = []  # the import-only dependencies a stand-in served while the sources loaded

# The profile (flags of conventions.Convention, as data). Against SkyRL-train 0.3.1:
# * micro_batch "global": the reduction is folded into the advantages over the mini-batch (SkyRL-train
#   reduced each micro-batch and divided by the accumulation steps, "local_mean");
# * masked_nonfinite "propagate": the losses return (loss * loss_mask).sum();
# * empty_rows "keep" (sequence_mean divides by every row of the mini-batch, an empty one included)
#   and token_sum_rows "all" (seq_mean_token_sum_norm: / (rows x max_seq_len));
# * compute_dtype "input", and the ratio of regular / dual_clip / cispo from safe_exp_delta
#   (torch_utils.py): clamp(delta.to(float32), -20, 20).exp().to(log_probs.dtype).
_COMMON = {"micro_batch": "global", "masked_nonfinite": "propagate", "compute_dtype": "input",
           "empty_rows": "keep", "token_sum_rows": "all"}
_SAFE_EXP = {"log_ratio_clamp": 20.0, "ratio_dtype": "float32"}
_TIE = {"dual_clip_tie": "half"}
# the KL loss: compute_approx_kl without @torch.no_grad() (the gradient flows), k3 with log r clamped
# to +-20 and the value to +-10, exp(log r) - log r - 1 evaluated directly
_KL_FLAGS = {"kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0, "kl_k3_form": "naive"}
# ... aggregated as masked_mean(kl, loss_mask, dim=-1).mean() whatever loss_reduction says (worker.py:1232),
# each micro-batch's weighed by its share of the mini-batch's rows: a row mean over every row
_KL_LOSS = {**_KL_FLAGS, "kl_aggregation": "row_mean_all_rows"}


def _cfg(loss: str, reduction: str, **keys) -> dict:
    return {"policy_loss_type": loss, "loss_reduction": reduction, **keys}


_POLICY_MODES = (
    Mode("regular/token_mean", preset="ppo", framework_config=_cfg("regular", "token_mean"),
         convention={**_COMMON, **_SAFE_EXP},
         description="ppo_policy_loss: clipped surrogate, token mean of the mini-batch"),
    Mode("regular/token_mean/clip-higher", preset="dapo",
         framework_config=_cfg("regular", "token_mean", eps_clip_high=0.28),
         convention={**_COMMON, **_SAFE_EXP},
         description="eps_clip_low 0.2, eps_clip_high 0.28 (DAPO's clip-higher), token mean"),
    Mode("regular/sequence_mean", preset="grpo", framework_config=_cfg("regular", "sequence_mean"),
         convention={**_COMMON, **_SAFE_EXP},
         description="clipped surrogate, mean of each row, mean over every row of the mini-batch"),
    Mode("regular/seq_mean_token_sum_norm", preset="dr_grpo", variant_overrides={"max_length": 16},
         framework_config=_cfg("regular", "seq_mean_token_sum_norm", max_seq_len=16),
         convention={**_COMMON, **_SAFE_EXP},
         description="Dr. GRPO: each row's token sum / max_seq_len, mean over every row"),
    Mode("dual_clip/token_mean", preset="ppo", variant_overrides={"dual_clip": 3.0},
         framework_config=_cfg("dual_clip", "token_mean", clip_ratio_c=3.0),
         convention={**_COMMON, **_SAFE_EXP, **_TIE},
         description="dual-clip PPO (clip_ratio_c 3.0) for A < 0, token mean"),
    Mode("gspo", preset="gspo", variant_overrides={"aggregation": "seq_mean_token_mean"},
         framework_config=_cfg("gspo", "sequence_mean"),
         convention={**_COMMON, "sequence_ratio_gradient": "token", "sequence_log_ratio_cap": 10.0},
         description="gspo_policy_loss: GSPO-token ratio (log cap 10), sequence_mean"),
    Mode("sapo", preset="sapo", framework_config=_cfg("sapo", "sequence_mean"),
         convention={**_COMMON, "log_ratio_clamp": 20.0},
         description="sapo_policy_loss: sigmoid gate, log-ratio clamped to +-20, sequence_mean"),
    Mode("regular/sequence_mean+kl/k3", preset="grpo",
         variant_overrides={"kl_coef": 0.001, "kl_estimator": "k3"},
         framework_config=_cfg("regular", "sequence_mean", use_kl_loss=True, kl_loss_coef=0.001,
                               kl_estimator_type="k3"),
         convention={**_COMMON, **_SAFE_EXP, **_KL_LOSS, "zero_rows": "nan"},
         description="sequence_mean + kl_loss_coef * masked_mean(k3, dim=-1).mean() (use_kl_loss, the "
         "default config), with its gradient"),
    Mode("regular/token_mean+kl/k3", preset="ppo", variant_overrides={"kl_coef": 0.001, "kl_estimator": "k3"},
         framework_config=_cfg("regular", "token_mean", use_kl_loss=True, kl_loss_coef=0.001,
                               kl_estimator_type="k3"),
         convention={**_COMMON, **_SAFE_EXP, **_KL_LOSS, "zero_rows": "nan"},
         description="token_mean (the default loss_reduction) + kl_loss_coef * masked_mean(k3, "
         "dim=-1).mean(), with its gradient: the KL term a mean of row means over every row"),
    Mode("cispo", preset="cispo", variant_overrides={"eps_high": 5.0},
         framework_config=_cfg("cispo", "token_mean"),
         convention={**_COMMON, **_SAFE_EXP, "zero_rows": "raise"},
         description="compute_policy_loss_cispo with the release's default cispo_eps_clip_low (1.0 in "
         "0.4.0: sg(clamp(r, 0, 1 + 5)) A logp, CISPO's one-sided cap)"),
)

# importance_sampling (the Tinker loss: gate none, -A r) takes exp of the raw log-ratio (ppo_utils.py:1128,
# as clip_cov :960 and kl_cov :1021: SkyRL-train's finding ratio_overflow lists them); the trainer scales
# its advantages as any loss's (RayPPOTrainer._normalize_advantages), the loss returns the masked sum
_OVERFLOW_MODES = (Mode(
    "importance_sampling", preset="ppo",
    variant_overrides={"gate": "none", "eps_low": None, "eps_high": None},
    framework_config=_cfg("importance_sampling", "token_mean"),
    convention={**_COMMON, **skyrl_common.OVERFLOW},
    description="importance_sampling_loss: -(exp(log r) A) summed over the tokens of the trainer's scaled "
    "advantages (token_mean), unclamped"),)

# GRPO's estimator is verl's (unchanged from SkyRL-train 0.3.1)
_GRPO = {"adv_std": "sample", "adv_eps": 1e-6, "adv_eps_inside_sqrt": False, "adv_zero_variance": "formula",
         "adv_singleton": "raw", "adv_singleton_float32": True}
_ADV_MODES = (
    Mode("grpo", kind="group_advantages",
         framework_config={"advantage_estimator": "grpo", "grpo_norm_by_std": True},
         convention=_GRPO, description="compute_grpo_outcome_advantage(grpo_norm_by_std=True)"),
    Mode("grpo/no_std", kind="group_advantages",
         framework_config={"advantage_estimator": "grpo", "grpo_norm_by_std": False},
         convention={**_GRPO, "adv_scale": "none"},
         description="compute_grpo_outcome_advantage(grpo_norm_by_std=False): Dr. GRPO's mean-centring"),
    Mode("rloo", kind="group_advantages", framework_config={"advantage_estimator": "rloo"},
         convention={"adv_scale": "none", "adv_leave_one_out": True},
         description="compute_rloo_outcome_advantage: leave-one-out baseline, a singleton gets 0"),
)

# compute_approx_kl alone (kind "kl"): with its gradient since 0.3.0
_KL_MODES = tuple(
    Mode(f"kl/{k}", kind="kl", variant_overrides={"kl_estimator": k},
         framework_config={"kl_estimator_type": k},
         convention=dict(_KL_FLAGS) if k == "k3" else {},
         description=f"compute_approx_kl(kl_estimator_type={k!r})")
    for k in ("k1", "k2", "k3")
)

UNSUPPORTED = {
    "policy_loss": {
        "token_mean_legacy / prompt_mean": "token_mean_legacy is SkyRL-train's per-micro-batch mean "
        "(driver skyrl); prompt_mean needs the prompts' boundaries, which the kit's calls do not carry.",
        "rollout_is / dppo / off_policy_correction / cispo_anchor='rollout'": "need the rollout log-probs.",
        "clip_cov / kl_cov": "pick tokens by a covariance ranking; no spec variant (their raw exp, as "
        "importance_sampling's: SkyRL-train's finding ratio_overflow, driver skyrl's clip_cov/no-selection).",
        "cross_entropy": "the SFT loss, not a policy-gradient loss of the spec.",
        "use_entropy_loss": "the entropy comes from the model's logits (its aggregation: finding "
        "entropy_aggregation).",
    },
    "kl": {"abs": "|logp - ref_logp| is not a KL estimator of kl.md."},
    "group_advantages": {
        "gae / reinforce++ / maxrl": "per-token returns or a maximum-likelihood reweighting, not a group "
        "estimator of the spec's outcome rewards (maxrl's sign flip for a negative group mean: finding "
        "config:maxrl_rewards).",
    },
}

#: what a release computes differently from the pinned one (releases.py): 0.3.0's CISPOConfig
#: defaults cispo_eps_clip_low to 0.0 (train/config/config.py:543), 0.4.0's to 1.0 (config.py:832); and
#: 0.3.0's compute_policy_loss_cispo logs no ratio.max(), so a batch without rows does not raise there
RELEASE_FLAGS = {"0.3.0": {"cispo": {"cispo_clip_low": 0.0, "zero_rows": "zero"}}}
MODES = release_modes(_POLICY_MODES + _OVERFLOW_MODES + _KL_MODES + _ADV_MODES, RELEASE_FLAGS, DISTRIBUTION)
PROFILE = {
    "ppo": ("grpo", "regular/token_mean"),
    "bnpo": ("grpo", "regular/token_mean"),
    "dapo": ("grpo", "regular/token_mean/clip-higher"),
    "grpo": ("grpo", "regular/sequence_mean"),
    "dr_grpo": ("grpo/no_std", "regular/seq_mean_token_sum_norm"),
    "gspo": ("grpo", "gspo"),
    "sapo": ("grpo", "sapo"),
    "cispo": ("grpo", "cispo"),
}

_RELEASE = distribution_version(DISTRIBUTION)
_CISPO_FINDING = Finding(
    "cispo_clip_low", "bug",
    "CISPOConfig.cispo_eps_clip_low defaults to 0.0: the CISPO weight is clipped below at 1, every ratio "
    "below 1 raised to 1, where CISPO (MiniMax 2025; ScaleRL's clip(r, 0, eps_max)) leaves it.",
    where="train/config/config.py:543", quote="cispo_eps_clip_low: float = 0.0",
    affected="skyrl 0.3.0 (and SkyRL-train 0.3.1)",
    fixed_in="skyrl 0.4.0 (default 1.0, train/config/config.py:832)",
    upstream="https://github.com/NovaSky-AI/SkyRL/pull/1928",
)
_GAE = next(m for m in skyrl_kinds.KIND_MODES if m.kind == "gae")
_VALUE = next(m for m in skyrl_kinds.KIND_MODES if m.kind == "value_loss")
#: the registry's kinds: GAE and the critic loss (SkyRL-train 0.3.1's code, unchanged: skyrl_kinds.py)
KIND_MODES = (dataclasses.replace(_GAE, description=_GAE.description.replace(
    "ppo_utils.py:999", f"{_BACKEND}/utils/ppo_utils.py:1313")),
    dataclasses.replace(_VALUE, description=_VALUE.description.replace(
        "ppo_utils.py:178", f"{_BACKEND}/utils/ppo_utils.py:156")))
KIND_UNSUPPORTED: dict[str, dict[str, str]] = {}
FINDINGS = (
    Finding(
        "padding_values", "bug",
        "compute_gae_advantage_return runs the recursion over the padded row without the mask, as "
        "SkyRL-train's: the last token of a response shorter than the batch's longest bootstraps gamma * V "
        "at index T_i (the critic's output at its last token, never trained), the pads' TD errors flow back; "
        "with gamma * lambd < 1 the advantages and returns shift (the defaults 1.0 telescope it away).",
        where=f"{_BACKEND}/utils/ppo_utils.py:1332",
        quote="nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0",
        affected="skyrl 0.4.0 (and SkyRL-train 0.3.1)",
    ),
    dual_clip_tie_finding(f"{_BACKEND}/utils/ppo_utils.py:{574 if _RELEASE == '0.3.0' else 575}",
                          "clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)", "skyrl 0.3.0, 0.4.0"),
    *((_CISPO_FINDING,) if _RELEASE == "0.3.0" else ()),
    *(() if _RELEASE == "0.3.0" else (Finding("zero_rows='raise'", "value_only",
            "compute_policy_loss_cispo logs ratio.max() of the whole ratio when no token is active: on a "
            "batch without rows max() of an empty tensor raises RuntimeError and the step stops; the loss "
            "itself, a masked sum, would be 0 with an empty gradient (mode cispo).",
            where=f"{_BACKEND}/utils/ppo_utils.py:804", quote="cispo_ratio_max = ratio.max().detach().item()",
            affected="skyrl 0.4.0"),)),
    # the KL loss's mean over rows (the policy losses return masked sums: a batch without rows gives 0)
    dataclasses.replace(zero_rows_finding(
        f"{_BACKEND}/workers/worker.py:{977 if _RELEASE == '0.3.0' else 1232}",
        "kl_loss = masked_mean(kl_loss, loss_mask, dim=-1).mean()",
        "skyrl 0.3.0, 0.4.0 (the KL loss of use_kl_loss)"), key="zero_rows='nan'"),
    # the lines below are 0.4.0's (tests/test_framework_findings.py checks them for the pinned release);
    # ratio_overflow, config:clip_ratio_c and config:max_seq_len are SkyRL-train's findings (driver skyrl),
    # whose `affected` give 0.4.0's lines: one script each
    skyrl_common.kl_value_clamp_finding(f"{_BACKEND}/utils/ppo_utils.py:118",
                                        "kld = torch.clamp(kld, min=-10, max=10)", "skyrl 0.4.0"),
    *skyrl_common.loss_term_findings(
        f"{_BACKEND}/workers/worker.py:{977 if _RELEASE == '0.3.0' else 1232}",
        f"{_BACKEND}/workers/worker.py:{962 if _RELEASE == '0.3.0' else 1217}", "skyrl 0.3.0, 0.4.0",
        "each micro-batch's KL loss is weighed by its share of the mini-batch's rows (microbatch_weight), "
        "so the row means are averaged over every row of the mini-batch"),
    skyrl_common.kl_cov_frac_finding("train/config/config.py:823", "kl_cov_frac: float = 0.2", "skyrl 0.4.0"),
    *(() if _RELEASE == "0.3.0" else skyrl_common.scaled_advantage_findings(_BACKEND)),  # Clip/KL-Cov, legacy
    skyrl_common.maxrl_rewards_finding(
        f"{_BACKEND}/utils/ppo_utils.py:{1366 if _RELEASE == '0.3.0' else 1423}",
        "scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)", "skyrl 0.3.0, 0.4.0"),
    # 0.3.0's CISPO defaults are 0.0 and 5.0, undocumented (finding cispo_clip_low)
    *(() if _RELEASE == "0.3.0" else (skyrl_common.cispo_defaults_finding(
        "train/config/config.py:837", "cispo_eps_clip_high: float = 4.0", "skyrl 0.4.0"),)),
)

NOTES = {
    "cispo without rows": "compute_policy_loss_cispo logs ratio.max() / ratio.min() of the whole ratio when "
    "no token is active (backends/skyrl_train/utils/ppo_utils.py:804): a batch without rows raises "
    "RuntimeError (max() of an empty tensor): flag zero_rows='raise' of mode cispo (a finding).",
    "skyrl-train's findings": "SkyRL-train 0.3.1's findings ratio_overflow (clip_cov, kl_cov and here "
    "importance_sampling too: mode importance_sampling), config:clip_ratio_c, config:max_seq_len, "
    "padding_values and whiten_mean hold here (their lines in the findings); kl_gradient and "
    "cispo_clip_low are fixed: compute_approx_kl has no "
    "@torch.no_grad() from skyrl 0.3.0 on (the KL loss has its gradient, which its kept k3 clamps zero "
    "where k3 > 10: finding kl_value_clamp), and CISPOConfig's cispo_eps_clip_low defaults to 1.0 from "
    "skyrl 0.4.0 on (0.0 in 0.3.0: docs/conformance-drift.md).",
}


# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code (or defaults) the driver runs; [] when absent."""
    files = installed_files("skyrl", _SOURCES)
    return files if files and files[0].is_file() else []


def _ray_stand_in():
    def remote(cls=None, **_options):
        return cls if cls is not None else (lambda c: c)

    return stand_in("ray", remote=remote, is_initialized=lambda: False)


@functools.cache
def _modules():
    """``(ppo_utils, config)`` executed from the installed files (see the module docstring)."""
    root = package_dir("skyrl")
    if root is None:
        raise ModuleNotFoundError(f"skyrl is not installed ({_INSTALL})")
    if not (root / _SOURCES[0]).is_file():
        raise ModuleNotFoundError(f"this skyrl release has no {_SOURCES[0]} (the driver runs 0.3.0 and "
                                  "later)")
    private_package(_PRIVATE)
    torch_utils = load_source(f"{_PRIVATE}.torch_utils", root / _SOURCES[1])
    absolute = "skyrl.backends.skyrl_train.utils"
    with temporary_modules({f"{absolute}.torch_utils": torch_utils}, only_if_missing=False):
        correction = load_source(f"{_PRIVATE}.off_policy_correction_utils", root / _SOURCES[2])
    with stubbed_imports(("skyrl_gym",)) as stubbed:
        config = load_source(f"{_PRIVATE}.config", root / _SOURCES[3])
    served = {f"{absolute}.torch_utils": torch_utils,
              f"{absolute}.off_policy_correction_utils": correction, "skyrl.train.config": config}
    with temporary_modules(served, only_if_missing=False), \
            temporary_modules({"ray": _ray_stand_in()}) as placed:
        ppo_utils = load_source(f"{_PRIVATE}.ppo_utils", root / _SOURCES[0])
    STUBBED[:] = [*placed, *stubbed]
    return ppo_utils, config


def availability() -> str | None:
    """None when skyrl's loss code can be driven, else a one-line reason."""
    return load_failure("skyrl", _INSTALL, _modules)


def algorithm_config(keys: dict):
    """The installed ``AlgorithmConfig()`` (the release's defaults) with ``keys`` set; a dotted key
    ``"cispo.cispo_eps_clip_low"`` sets a field of a nested config."""
    _ppo, config_module = _modules()
    config = config_module.AlgorithmConfig()
    for key, value in keys.items():
        head, _, field = key.partition(".")
        if field:
            setattr(config, head, dataclasses.replace(getattr(config, head), **{field: value}))
        else:
            setattr(config, head, value)
    return config


# ----------------------------------------------------------------------------------------------
# Modes


def config_keys(mode: str | Mode, variant) -> dict[str, object]:
    """The ``AlgorithmConfig`` keys that run ``variant`` in ``mode`` (ValueError for a variant skyrl
    cannot express there)."""
    m = find_mode(MODES, mode, "skyrl")
    v = variant
    m.check_shape(v, "skyrl")
    if v.kl_coef > 0 and v.kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError("variant.kl_estimator: skyrl's KL loss is driven with k1 / k2 / k3")
    if v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction: not driven for skyrl")
    keys = dict(m.framework_config)
    loss = keys["policy_loss_type"]
    if loss == "sapo":
        keys.update({"sapo.tau_pos": v.tau_pos, "sapo.tau_neg": v.tau_neg})
    elif loss == "importance_sampling":  # no clip (gate none)
        pass
    elif loss == "cispo":
        if v.eps_high is None:
            raise ValueError("variant.eps_high: skyrl's cispo needs an upper bound")
        keys["cispo.cispo_eps_clip_high"] = v.eps_high
        if v.eps_low is not None:
            keys["cispo.cispo_eps_clip_low"] = v.eps_low
    else:
        if v.eps_low is None or v.eps_high is None:
            raise ValueError(f"variant.eps_low / eps_high: skyrl's {loss} clips on both sides")
        keys.update(eps_clip_low=v.eps_low, eps_clip_high=v.eps_high)
        if (loss == "dual_clip") != (v.dual_clip is not None):
            raise ValueError("variant.dual_clip: set exactly for policy_loss_type 'dual_clip'")
        if v.dual_clip is not None:
            keys["clip_ratio_c"] = v.dual_clip
    if keys["loss_reduction"] == "seq_mean_token_sum_norm":
        if v.max_length is None:
            raise ValueError("variant.max_length (skyrl's max_seq_len) is required by "
                             "seq_mean_token_sum_norm")
        keys["max_seq_len"] = int(v.max_length)
    keys.update(use_kl_loss=v.kl_coef > 0, kl_loss_coef=float(v.kl_coef), kl_estimator_type=v.kl_estimator)
    return keys


# ----------------------------------------------------------------------------------------------
# Targets


def _share(call, reduction: str) -> float:
    """The micro-batch's share of the mini-batch: of its tokens (token_mean) or rows (the others)."""
    if int(getattr(call, "micro_batch_count", 1) or 1) == 1:
        return 1.0
    if reduction == "token_mean":
        return float(call.mask.sum()) / max(int(call.global_tokens), 1)
    return call.mask.shape[0] / max(int(call.global_rows), 1)


def _policy_target(m: Mode, variant) -> tuple[Callable, Callable]:
    module, _config = _modules()
    keys = config_keys(m, variant)
    config = algorithm_config(keys)
    loss_fn = module.PolicyLossRegistry.get(keys["policy_loss_type"])

    def adapter(fn, call):
        advantages = call.advantages
        if advantages.ndim == 1:  # skyrl's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        mask = call.mask.to(call.logp.dtype)  # the float loss_mask of skyrl's batches
        rows = call.mask.shape[0]
        # the trainer's scaling over the mini-batch (RayPPOTrainer._normalize_advantages)
        scaled = module.apply_loss_reduction_to_advantages_minibatch(
            advantages, mask, config.loss_reduction, micro_batch_size=rows, max_seq_len=config.max_seq_len,
        ) * _share(call, config.loss_reduction)
        loss, _metrics = fn(call.logp, call.old_logp, scaled, config=config, loss_mask=mask)
        if config.use_kl_loss:  # _forward_backward_micro: KL term weighed by the micro-batch's rows
            kl = module.compute_approx_kl(call.logp, call.ref_logp, loss_mask=mask,
                                          kl_estimator_type=config.kl_estimator_type)
            weight = rows / max(int(call.global_rows or rows), 1)
            loss = loss + module.masked_mean(kl, mask, dim=-1).mean() * config.kl_loss_coef * weight
        return loss

    adapter.scaled_for_accumulation = True
    return loss_fn, adapter


def _advantage_target(m: Mode) -> tuple[Callable, Callable]:
    module, _config = _modules()
    config = dict(m.framework_config)
    estimator = module.AdvantageEstimatorRegistry.get(config.pop("advantage_estimator"))

    def adapter(fn, rewards, group_ids):
        import numpy as np
        import torch

        token_rewards = rewards.reshape(-1, 1).clone()  # one token carries the outcome reward
        mask = torch.ones_like(token_rewards)
        advantages, _returns = fn(token_level_rewards=token_rewards, response_mask=mask,
                                  index=np.asarray(group_ids.cpu().numpy()), **config)
        return advantages.reshape(-1)

    return estimator, adapter


def _kl_target(m: Mode) -> tuple[Callable, Callable]:
    estimator = m.framework_config["kl_estimator_type"]

    def adapter(fn, logp, ref_logp):
        return fn(logp, ref_logp, kl_estimator_type=estimator)

    return _modules()[0].compute_approx_kl, adapter


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` driving skyrl's own registered function for ``mode`` (as the skyrl driver:
    policy_loss, kl, group_advantages)."""
    if mode.kind == "policy_loss":
        return _policy_target(mode, variant)
    if mode.kind == "kl":
        return _kl_target(mode)
    return _advantage_target(mode)


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running skyrl's own function for a registry-kind mode (skyrl_kinds.py)."""
    return skyrl_kinds.kind_target(mode, _modules()[0], algorithm_config)
