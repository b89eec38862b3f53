"""Driver for the installed SkyRL-train (0.3.1): the policy losses of its ``PolicyLossRegistry`` and
the outcome advantage estimators of its ``AdvantageEstimatorRegistry``
(skyrl_train/utils/ppo_utils.py), called by the conformance kit.

How SkyRL is imported. SkyRL-train declares Python 3.12 only and depends on ray, vllm, flash-attn...;
it is installed with ``--no-deps --ignore-requires-python`` (its loss code runs on 3.11).
``skyrl_train.utils``'s ``__init__`` imports ray's placement groups, fsspec and s3fs, so the driver
executes the one installed file it runs, ``utils/ppo_utils.py``, unchanged, as the private module
``_refimpl_skyrl.ppo_utils`` (``sources.load_source``). Its imports: torch, numpy, omegaconf,
jaxtyping and loguru (installed: ``REQUIREMENTS``), ``skyrl_train.training_batch``
(plain), and ``ray``, used at import time only as the decorator ``@ray.remote`` of the registry's
actor class and, in the registries, as ``ray.is_initialized()``: when ray is not installed a stand-in
(``remote`` the identity, ``is_initialized`` False: SkyRL's own behaviour before ``ray.init``) serves
the import and is removed from ``sys.modules`` afterwards. The registries are the module's own,
filled by its decorators; the driver takes each loss and estimator from them by name.

What a call does (``PolicyWorkerBase.forward_backward``, workers/worker.py:625-692, one rank):
``policy_loss_fn(log_probs, old_log_probs, advantages, config=cfg.trainer.algorithm,
loss_mask=loss_mask)`` with per-token advantages (SkyRL's estimators broadcast the sequence's
advantage to its tokens), the float loss mask, and the ``trainer.algorithm`` section of the installed
``config/ppo_base_config.yaml`` with the mode's keys; ``max_seq_len`` is set as the trainer sets it
(utils/utils.py:278): the prompt budget ``max_input_length`` plus the response budget L_max. The worker
divides each micro-batch loss by the accumulation steps
before backward; the adapter applies that division (``micro_batch="local_mean"``: every reduction is
local to the micro-batch), the only arithmetic here that is not SkyRL's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import Mode, skyrl_common, skyrl_kinds
from .driver import find_mode
from .findings import Finding, dual_clip_tie_finding, zero_rows_finding
from .skyrl_kinds import KIND_MODES, KIND_UNSUPPORTED
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
    stand_in,
    temporary_modules,
)

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "DISTRIBUTION",
    "MODES",
    "UNSUPPORTED",
    "PROFILE",
    "NOTES",
    "FINDINGS",
    "STUBBED",
    "availability",
    "source_files",
    "algorithm_config",
    "config_keys",
    "target",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
]

NAME = "skyrl"
PINNED_VERSION = "0.3.1"
DISTRIBUTION = "skyrl-train"
#: ppo_utils.py imports omegaconf, jaxtyping (with wadler-lindig) and loguru; ray is stubbed
REQUIREMENTS = ("omegaconf==2.4.0", "loguru==0.7.3", "jaxtyping==0.3.11", "wadler-lindig==0.1.8")
#: SkyRL-train declares Requires-Python ==3.12.*; its loss code runs on 3.10+
INSTALL_OPTIONS = ("--ignore-requires-python",)
_PRIVATE = "_refimpl_skyrl"
_SOURCES = ("utils/ppo_utils.py", "config/ppo_base_config.yaml", "workers/worker.py", "trainer.py")
_PKG = "backends/skyrl_train/utils/ppo_utils.py"  # the file in skyrl 0.4.0 (driver skyrl_pkg)
_INSTALL = "refimpl frameworks install skyrl"
STUBBED: list[str] = []  # the import-only dependencies a stand-in served while ppo_utils.py loaded

# The profile (flags of conventions.Convention, as data):
# * micro_batch "local_mean": every reduce_loss mode is local to the call, the worker divides by the
#   accumulation steps;
# * masked_nonfinite "propagate": masked_mean and reduce_loss multiply by the mask;
# * empty_rows "keep" (sequence_mean: masked_mean(dim=-1) gives an empty row 0, .mean() counts it) and
#   token_sum_rows "all" (seq_mean_token_sum_norm: torch.mean over every row);
# * zero_rows "nan" (sequence_mean, seq_mean_token_sum_norm, gspo, sapo): .mean() over 0 rows;
# * compute_dtype "input": nothing is upcast (bf16 / fp16 log-probs give a bf16 / fp16 loss), except
#   the ratio of the regular / dual_clip / cispo losses, see _SAFE_EXP.
_COMMON = {"micro_batch": "local_mean", "masked_nonfinite": "propagate", "compute_dtype": "input",
           "empty_rows": "keep", "token_sum_rows": "all"}
# regular / dual_clip / cispo take the ratio from _safe_exp_delta (ppo_utils.py:547-552):
# clamp(delta.to(float32), -20, 20).exp().to(log_probs.dtype): the +-20 clamp (log_ratio_clamp) and a
# ratio evaluated in float32 whatever the inputs' dtype (ratio_dtype "float32").
_SAFE_EXP = {"log_ratio_clamp": 20.0, "ratio_dtype": "float32"}
# dual_clip: torch.min(-A c, loss) at r == c (float32 r = 3.0) halves the gradient (ppo_utils.py:581)
_TIE = {"dual_clip_tie": "half"}
_ROWS = {"zero_rows": "nan"}
# the KL loss (use_kl_loss, worker.py:679-692): compute_approx_kl under @torch.no_grad() (ppo_utils.py:91),
# k3 with log r clamped to +-20 and the value to +-10, exp(log r) - log r - 1 evaluated directly
_KL_FLAGS = {"kl_gradient": "none", "kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0, "kl_k3_form": "naive"}
# ... as masked_mean(kl, loss_mask, dim=-1).mean() whatever loss_reduction says (worker.py:686, a finding)
_KL_LOSS = {**_KL_FLAGS, "kl_aggregation": "row_mean_all_rows"}


def _cfg(loss: str, reduction: str, **keys) -> dict:
    return {"policy_loss_type": loss, "loss_reduction": reduction, **keys}


_POLICY_MODES = (
    Mode("regular/token_mean", preset="ppo", framework_config=_cfg("regular", "token_mean"),
         convention={**_COMMON, **_SAFE_EXP},
         description="ppo_policy_loss: clipped surrogate, token mean of the micro-batch"),
    Mode("regular/token_mean/clip-higher", preset="dapo",
         framework_config=_cfg("regular", "token_mean", eps_clip_high=0.28),
         convention={**_COMMON, **_SAFE_EXP},
         description="eps_clip_low 0.2, eps_clip_high 0.28 (DAPO's clip-higher), token mean"),
    Mode("regular/sequence_mean", preset="grpo", framework_config=_cfg("regular", "sequence_mean"),
         convention={**_ROWS, **_COMMON, **_SAFE_EXP},
         description="clipped surrogate, mean of each row, mean over every row"),
    # max_seq_len is what SkyRL's trainer sets (utils/utils.py:278): the prompt budget (max_input_length,
    # 512 by default) plus the response budget (max_generate_length, the variant's L_max)
    Mode("regular/seq_mean_token_sum_norm", preset="dr_grpo", variant_overrides={"max_length": 16},
         framework_config=_cfg("regular", "seq_mean_token_sum_norm", max_input_length=512),
         convention={**_ROWS, **_COMMON, **_SAFE_EXP, "seq_sum_extra": 512},
         description="Dr. GRPO: each row's token sum / max_seq_len (= max_input_length + "
         "max_generate_length, the trainer's setting), mean over every row"),
    Mode("dual_clip/token_mean", preset="ppo", variant_overrides={"dual_clip": 3.0},
         framework_config=_cfg("dual_clip", "token_mean", clip_ratio_c=3.0),
         convention={**_COMMON, **_SAFE_EXP, **_TIE},
         description="dual-clip PPO (clip_ratio_c 3.0) for A < 0, token mean"),
    Mode("gspo", preset="gspo", variant_overrides={"aggregation": "seq_mean_token_mean"},
         framework_config=_cfg("gspo", "sequence_mean"),
         convention={**_ROWS, **_COMMON, "sequence_ratio_gradient": "token", "sequence_log_ratio_cap": 10.0},
         description="gspo_policy_loss: GSPO-token ratio (log cap 10), sequence_mean"),
    Mode("sapo", preset="sapo", framework_config=_cfg("sapo", "sequence_mean"),
         convention={**_ROWS, **_COMMON, "log_ratio_clamp": 20.0},
         description="sapo_policy_loss: sigmoid gate, log-ratio clamped to +-20, sequence_mean"),
    Mode("regular/sequence_mean+kl/k3", preset="grpo",
         variant_overrides={"kl_coef": 0.001, "kl_estimator": "k3"},
         framework_config=_cfg("regular", "sequence_mean", use_kl_loss=True, kl_loss_coef=0.001,
                               kl_estimator_type="k3"),
         convention={**_ROWS, **_COMMON, **_SAFE_EXP, **_KL_LOSS},
         description="sequence_mean + kl_loss_coef * masked_mean(k3, dim=-1).mean(): a KL value without "
         "a gradient (use_kl_loss, the default config)"),
    Mode("regular/token_mean+kl/k3", preset="ppo", variant_overrides={"kl_coef": 0.001, "kl_estimator": "k3"},
         framework_config=_cfg("regular", "token_mean", use_kl_loss=True, kl_loss_coef=0.001,
                               kl_estimator_type="k3"),
         convention={**_ROWS, **_COMMON, **_SAFE_EXP, **_KL_LOSS},
         description="token_mean (the default loss_reduction) + kl_loss_coef * masked_mean(k3, "
         "dim=-1).mean(): the KL term a mean of row means over every row, not a token mean"),
    Mode("cispo", preset="cispo", variant_overrides={"eps_high": 5.0},
         framework_config=_cfg("cispo", "token_mean", **{"cispo.cispo_eps_clip_low": 0.0}),
         convention={**_COMMON, **_SAFE_EXP, "cispo_clip_low": 0.0},
         description="compute_policy_loss_cispo with SkyRL's defaults: sg(clamp(r, 1 - 0, 1 + 5)) A logp: "
         "a ratio below 1 is raised to 1"),
    Mode("cispo/upper-only", preset="cispo", variant_overrides={"eps_high": 5.0},
         framework_config=_cfg("cispo", "token_mean", **{"cispo.cispo_eps_clip_low": 1.0}),
         convention={**_COMMON, **_SAFE_EXP},
         description="cispo with cispo_eps_clip_low 1 (lower bound 0: the one-sided cap of the paper)"),
)

# clip_cov (ppo_utils.py:755) where it is a spec variant: exp of the raw log-ratio (kl_cov's too, :841)
_COV_MODES = (skyrl_common.clip_cov_mode(_COMMON, _cfg),)

# GRPO's estimator is verl's (ppo_utils.py: "ported from verl"): sample std, std + eps, (R - mean) / eps
# for a constant group; a singleton gets mean torch.tensor(0.0) / std torch.tensor(1.0), float32.
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

# compute_approx_kl alone (kind "kl"): value, no gradient (kl_gradient "none")
_KL_MODES = tuple(
    Mode(f"kl/{k}", kind="kl", variant_overrides={"kl_estimator": k},
         framework_config={"kl_estimator_type": k},
         convention={"kl_gradient": "none", **({k: v for k, v in _KL_FLAGS.items()} if k == "k3" else {})},
         description=f"compute_approx_kl(kl_estimator_type={k!r}) under @torch.no_grad()")
    for k in ("k1", "k2", "k3")
)

UNSUPPORTED = {
    "policy_loss": {
        "use_tis (truncated importance sampling)": "needs the rollout log-probs, which the kit's calls do "
        "not carry.",
        "clip_cov / kl_cov selecting tokens": "pick tokens by a covariance ranking (clip_cov at random, "
        "torch.randperm); no spec variant. clip_cov is driven where it selects none (clip_cov_lb > "
        "clip_cov_ub, mode clip_cov/no-selection); kl_cov shares its raw exp (finding ratio_overflow).",
        "gspo with token_mean / seq_mean_token_sum_norm": "SkyRL warns against it; GSPO's sequence ratio "
        "is driven with sequence_mean.",
        "use_entropy_loss": "the entropy comes from the model's logits (its aggregation: finding "
        "entropy_aggregation).",
    },
    "kl": {
        "abs": "|logp - ref_logp| is not a KL estimator of kl.md.",
    },
    "group_advantages": {
        "gae / reinforce++": "per-token returns over the response (values, gamma, lambda), not a group "
        "estimator of outcome rewards.",
    },
}


MODES = _POLICY_MODES + _COV_MODES + _KL_MODES + _ADV_MODES
# preset -> the modes whose flags, merged, are ``--convention skyrl --preset P`` (advantages first)
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
#: Departures SkyRL would likely want to change (the matrix lists them with the modes that show them).
FINDINGS = (
    Finding(
        "kl_gradient", "bug",
        "compute_approx_kl runs under @torch.no_grad(): with use_kl_loss the KL term adds its value to "
        "the loss and no gradient, so it does not regularise the policy.",
        where="utils/ppo_utils.py:91", quote="@torch.no_grad()",
        affected="skyrl-train 0.3.1 (its last release)",
        fixed_in="skyrl 0.3.0, the maintained successor package (compute_approx_kl has no decorator: driver "
        "skyrl_pkg, docs/conformance-drift.md); its k3 clamps, kept, then zero the restored gradient where "
        "k3 > 10 (skyrl_pkg finding kl_value_clamp)",
        upstream="https://github.com/NovaSky-AI/SkyRL/issues/1340 (fixed by pull request 1353)",
    ),
    Finding(
        "cispo_clip_low", "bug",
        "the CISPO weight is clipped below at 1 - cispo_eps_clip_low, 0 by default: every ratio below 1 "
        "is raised to 1 in the weight, where CISPO (MiniMax 2025; ScaleRL's clip(r, 0, eps_max)) leaves "
        "it; the maintainers changed the default to 1 as a fix.",
        where="utils/ppo_utils.py:744",
        quote="clamped_ratio = torch.clamp(ratio, 1 - config.cispo.cispo_eps_clip_low",
        affected="skyrl-train 0.3.1; skyrl 0.3.0 (default still 0.0)",
        fixed_in="skyrl 0.4.0 (default cispo_eps_clip_low = 1.0: driver skyrl_pkg, "
        "docs/conformance-drift.md)",
        upstream="https://github.com/NovaSky-AI/SkyRL/pull/1928",
    ),
    dual_clip_tie_finding("utils/ppo_utils.py:581",
                          "clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)", "skyrl-train 0.3.1"),
    Finding(
        "seq_sum_extra", "documented_default",
        "Dr. GRPO's seq_mean_token_sum_norm divides by max_seq_len, which the trainer sets to the prompt "
        "budget plus the response budget (a comment there says so), not the response budget L_max of "
        "Liu et al. 2025: a constant scale of the loss and gradient (1 + 512 / L_max at the defaults).",
        where="utils/utils.py:278",
        quote="algorithm_config.max_seq_len = cfg.generator.max_input_length + cfg.generator.sampling_params",
        affected="skyrl-train 0.3.1",
    ),
    Finding(
        "padding_values", "bug",
        "compute_gae_advantage_return runs the recursion over the padded row without the mask: the last "
        "token of every response shorter than the batch's longest bootstraps gamma * V at index T_i, the "
        "critic's output at the response's last token (model_wrapper.py:508-514; never trained), where an "
        "ended response has no next value, and the pad tokens' TD errors flow back; with gamma * lambd < 1 "
        "its tokens' advantages and the critic's returns shift (at the defaults gamma = lambd = 1 the "
        "padding telescopes away exactly).",
        where="utils/ppo_utils.py:1018", quote="nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0",
        affected="skyrl-train 0.3.1; skyrl 0.4.0 (backends/skyrl_train/utils/ppo_utils.py:1332)",
    ),
    Finding(
        "whiten_mean", "bug",
        "normalize_advantages_dict (advantage_batch_normalize) subtracts advantages.mean(), the mean over "
        "every position of the padded batch, padding included, and divides by the masked deviation from "
        "it: the normalised response tokens do not average 0 (the ragged case: -0.883), and the shift "
        "depends on the batch's padding.",
        where="utils/ppo_utils.py:142", quote="mean: float = advantages.mean()",
        affected="skyrl-train 0.3.1; skyrl 0.4.0 (train/trainer.py:1509, "
        "RayPPOTrainer._normalize_advantages)",
        upstream="https://github.com/NovaSky-AI/SkyRL/issues/1305 (open; fix proposed in pull request 1782)",
    ),
    zero_rows_finding("utils/ppo_utils.py:892", "loss = masked_mean(loss, loss_mask, dim=-1).mean()",
                      "skyrl-train 0.3.1 (sequence_mean; seq_mean_token_sum_norm likewise)"),
    # the scripted findings below hold skyrl 0.4.0 too (its lines in `affected`): one script each (CI)
    skyrl_common.overflow_finding("utils/ppo_utils.py:776", "ratio = torch.exp(negative_approx_kl)",
                                  f"skyrl-train 0.3.1; skyrl 0.4.0 ({_PKG}:960, 1021, 1128)",
                                  "compute_policy_loss_clip_cov (line 776), compute_policy_loss_kl_cov "
                                  "(line 841) and skyrl 0.4.0's importance_sampling_loss",
                                  function="compute_policy_loss_clip_cov"),
    skyrl_common.clip_ratio_c_finding("utils/ppo_utils.py:580",
                                      "pg_losses3 = -advantages * config.clip_ratio_c",
                                      f"skyrl-train 0.3.1; skyrl 0.4.0 ({_PKG}:574)"),
    skyrl_common.max_seq_len_finding(
        "utils/ppo_utils.py:899", "seq_losses = torch.sum(loss * loss_mask, dim=-1) / max_seq_len",
        f"skyrl-train 0.3.1; skyrl 0.4.0 ({_PKG}:1203, apply_loss_reduction_to_advantages_minibatch)",
        "SkyRL-train's trainer sets max_seq_len to the prompt budget plus the per-turn generation budget "
        "(utils/utils.py:278), which a multi-turn response can exceed; skyrl 0.4.0 requires the user to "
        "set it (train/utils/utils.py:500) and compares it with no response either.",
        upstream="https://github.com/NovaSky-AI/SkyRL/issues/1154 (the multi-turn max_seq_len; pull "
        "request 1303 made it a required setting)"),
    *skyrl_common.loss_term_findings(
        "workers/worker.py:686", "workers/worker.py:671", "skyrl-train 0.3.1",
        "the worker divides each micro-batch's loss by the accumulation steps, so the micro-batches' row "
        "means are averaged (equal weights, however many rows each holds)", kl_kind="value_only"),
    skyrl_common.kl_cov_frac_finding("config/ppo_base_config.yaml:151", "kl_cov_frac: 0.2",
                                     "skyrl-train 0.3.1; skyrl 0.4.0 (train/config/config.py:823)"),
)


NOTES = {
    "cispo defaults": "cispo_eps_clip_low defaults to 0: the ratio is clamped to [1, 6], raising every "
    "ratio below 1 to 1 (mode cispo, flag cispo_clip_low=0.0); the paper's one-sided cap is "
    "cispo_eps_clip_low = 1 (mode cispo/upper-only).",
}


# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code (or defaults) the driver runs; [] when absent."""
    return installed_files("skyrl_train", _SOURCES)


def _ray_stand_in():
    def remote(cls=None, **_options):
        return cls if cls is not None else (lambda c: c)

    return stand_in("ray", remote=remote, is_initialized=lambda: False)


@functools.cache
def _ppo_utils():
    """``utils/ppo_utils.py`` executed from the installed file (see the module docstring)."""
    root = package_dir("skyrl_train")
    if root is None:
        raise ModuleNotFoundError(f"SkyRL-train is not installed ({_INSTALL})")
    private_package(_PRIVATE)
    with temporary_modules({"ray": _ray_stand_in()}) as placed:
        module = load_source(f"{_PRIVATE}.ppo_utils", root / _SOURCES[0])
    STUBBED[:] = placed
    return module


def availability() -> str | None:
    """None when SkyRL's loss code can be driven, else a one-line reason."""
    return load_failure("skyrl_train", _INSTALL, _ppo_utils)


@functools.cache
def _shipped_config(path: str):
    """``(the YAML file's DictConfig, its trainer.algorithm as plain containers or None where that
    section interpolates)``, parsed once per process (parsing the whole file took about 10 % of a
    matrix build when every call did it)."""
    from omegaconf import OmegaConf

    root = OmegaConf.load(path)
    plain = OmegaConf.to_container(root.trainer.algorithm)
    return root, plain if plain == OmegaConf.to_container(root.trainer.algorithm, resolve=True) else None


def algorithm_config(keys: dict):
    """``trainer.algorithm`` of the installed ppo_base_config.yaml with ``keys`` (dotted) set: the
    DictConfig SkyRL's losses receive as ``config``, a new one at each call (from the file parsed
    once, ``_shipped_config``), so a caller may change it."""
    import copy

    from omegaconf import OmegaConf, open_dict

    shipped, plain = _shipped_config(str(package_dir("skyrl_train") / _SOURCES[1]))
    # a section without interpolations stands alone: a fresh root (a copy of the whole tree costs 3x more)
    config = OmegaConf.create(plain) if plain is not None else copy.deepcopy(shipped).trainer.algorithm
    with open_dict(config):
        config.max_seq_len = None
        for key, value in keys.items():
            OmegaConf.update(config, key, value, force_add=True)
    return config


# ----------------------------------------------------------------------------------------------
# Modes


def config_keys(mode: str | Mode, variant) -> dict[str, object]:
    """The ``trainer.algorithm`` keys that run ``variant`` in ``mode`` (ValueError for a variant SkyRL
    cannot express there)."""
    m = find_mode(MODES, mode, "SkyRL")
    v = variant
    m.check_shape(v, "SkyRL")
    if v.kl_coef > 0 and v.kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError("variant.kl_estimator: SkyRL's KL loss is driven with k1 / k2 / k3")
    if v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction: not driven for SkyRL")
    keys = dict(m.framework_config)
    loss = keys["policy_loss_type"]
    if loss == "sapo":
        keys.update({"sapo.tau_pos": v.tau_pos, "sapo.tau_neg": v.tau_neg})
    elif loss == "cispo":
        if v.eps_high is None:
            raise ValueError("variant.eps_high: SkyRL's cispo needs an upper bound")
        # the paper's one-sided cap is cispo_eps_clip_low = 1 (bound 0); the mode's flag cispo_clip_low
        # is SkyRL's default lower clip
        low = m.convention.get("cispo_clip_low", 1.0) if v.eps_low is None else v.eps_low
        keys.update({"cispo.cispo_eps_clip_low": low, "cispo.cispo_eps_clip_high": v.eps_high})
    else:
        if v.eps_low is None or v.eps_high is None:
            raise ValueError(f"variant.eps_low / eps_high: SkyRL's {loss} clips on both sides")
        keys.update(eps_clip_low=v.eps_low, eps_clip_high=v.eps_high)
        if (loss == "dual_clip") != (v.dual_clip is not None):
            raise ValueError("variant.dual_clip: set exactly for policy_loss_type 'dual_clip'")
        if v.dual_clip is not None:
            keys["clip_ratio_c"] = v.dual_clip
    if keys["loss_reduction"] == "seq_mean_token_sum_norm":
        if v.max_length is None:
            raise ValueError("variant.max_length (SkyRL's max_seq_len) is required by "
                             "seq_mean_token_sum_norm")
        keys["max_seq_len"] = int(keys.pop("max_input_length", 0)) + int(v.max_length)  # utils/utils.py:278
    keys.update(use_kl_loss=v.kl_coef > 0, kl_loss_coef=float(v.kl_coef), kl_estimator_type=v.kl_estimator)
    return keys


# ----------------------------------------------------------------------------------------------
# Targets


def _policy_target(m: Mode, variant) -> tuple[Callable, Callable]:
    module = _ppo_utils()
    keys = config_keys(m, variant)
    config = algorithm_config(keys)
    loss_fn = module.PolicyLossRegistry.get(keys["policy_loss_type"])

    def adapter(fn, call):
        advantages = call.advantages
        if advantages.ndim == 1:  # SkyRL's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        mask = call.mask.to(call.logp.dtype)  # the float loss_mask of SkyRL's batches
        loss, _clip_ratio = fn(call.logp, call.old_logp, advantages, config=config, loss_mask=mask)
        if config.use_kl_loss:  # forward_backward (worker.py:679-692)
            kl = module.compute_approx_kl(call.logp, call.ref_logp, loss_mask=mask,
                                          kl_estimator_type=config.kl_estimator_type)
            loss = loss + module.masked_mean(kl, mask, dim=-1).mean() * config.kl_loss_coef
        # forward_backward: loss / accumulation_steps
        return loss / int(getattr(call, "micro_batch_count", 1) or 1)

    adapter.scaled_for_accumulation = True
    return loss_fn, adapter


def _advantage_target(m: Mode) -> tuple[Callable, Callable]:
    module = _ppo_utils()
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

    return _ppo_utils().compute_approx_kl, adapter


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` driving SkyRL's own registered function for ``mode``.

    policy_loss: ``fn`` is the registry's loss, ``adapter(fn, call)`` its loss of the (micro-)batch
    (with the KL loss of ``use_kl_loss``) divided by the accumulation steps. kl: ``fn`` is
    ``compute_approx_kl``. group_advantages: ``fn`` is the registry's estimator,
    ``adapter(fn, rewards, group_ids)`` the advantages ``[N]``.
    """
    if mode.kind == "policy_loss":
        return _policy_target(mode, variant)
    if mode.kind == "kl":
        return _kl_target(mode)
    return _advantage_target(mode)


# ----------------------------------------------------------------------------------------------
# Kinds of the registry (refimpl/conformance/kinds/): GAE, the value loss, advantage whitening and the
# KL in the reward; the modes and their calls are in skyrl_kinds.py


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running SkyRL's own function for a registry-kind mode (skyrl_kinds.py)."""
    return skyrl_kinds.kind_target(mode, _ppo_utils(), algorithm_config)
