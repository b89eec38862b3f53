"""OpenRLHF: how the driver loads its installed loss code and calls it (see the package docstring)."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import types
import warnings
from collections.abc import Callable

from .. import Mode, distribution_version
from ..stubs import plain_torch_compile, stubbed_imports
from .modes import (
    _check_kind,
    _mode,
    _mode_variant,
    policy_loss_kwargs,
    unsupported_modes,
)

NAME = 'openrlhf'
PINNED_VERSION = '0.11.2'


_MODELS_PKG = "_refimpl_openrlhf_models"


_UTILS_PKG = "_refimpl_openrlhf_utils"


_SOURCES = ("models/loss.py", "models/utils.py", "utils/loss_utils.py",
            "trainer/ppo_utils/experience_maker.py",  # GAE, whitening, group advantages (kinds.py)
            "trainer/ppo_utils/length_penalty.py")  # the overlong penalty (kinds.py)


def _package_dir() -> pathlib.Path | None:
    spec = importlib.util.find_spec("openrlhf")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def installed_version() -> str | None:
    """The installed OpenRLHF version, or None."""
    return distribution_version("openrlhf")


def source_files() -> list[pathlib.Path]:
    """The installed files whose code the driver runs (for ``source_hash``); [] when absent."""
    root = _package_dir()
    return [] if root is None else [root / rel for rel in _SOURCES]


class _HostTorch:
    """``torch`` as the driver's copy of ``utils/loss_utils.py`` sees it: ``torch.cuda.is_available()``
    is False (``NOTES["device"]``); every other attribute is torch's own."""

    def __init__(self, torch_module) -> None:
        self._torch = torch_module
        self.cuda = types.SimpleNamespace(is_available=lambda: False)

    def __getattr__(self, name: str):
        return getattr(self._torch, name)


_LOADED: dict[str, types.ModuleType] = {}


STUBBED: list[str] = []  # which import-only dependencies were stubbed when the sources were loaded


def _private_package(name: str, folder: pathlib.Path) -> None:
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg


def _modules() -> dict[str, types.ModuleType]:
    """``{"loss", "utils", "loss_utils"}`` loaded from the installed files (see module docstring)."""
    if _LOADED:
        return _LOADED
    root = _package_dir()
    if root is None:
        raise ModuleNotFoundError("OpenRLHF is not installed (refimpl frameworks install openrlhf)")
    _private_package(_MODELS_PKG, root / "models")
    _private_package(_UTILS_PKG, root / "utils")
    with stubbed_imports(("deepspeed",)) as stubbed, plain_torch_compile():
        utils = importlib.import_module(f"{_MODELS_PKG}.utils")
        loss = importlib.import_module(f"{_MODELS_PKG}.loss")
    loss_utils = importlib.import_module(f"{_UTILS_PKG}.loss_utils")
    loss_utils.torch = _HostTorch(loss_utils.torch)  # NOTES["device"]: the normalisers on the CPU
    STUBBED[:] = stubbed
    _LOADED.update(loss=loss, utils=utils, loss_utils=loss_utils)
    return _LOADED


def availability() -> str | None:
    """None when the installed OpenRLHF loss code can be driven, else a one-line reason."""
    if _package_dir() is None:
        return "OpenRLHF is not installed (refimpl frameworks install openrlhf)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _modules()
    except Exception as exc:  # any import failure is reported, not raised
        return f"OpenRLHF's loss code cannot be imported: {type(exc).__name__}: {exc}"
    return None


def _step_counts(call, token_level: bool) -> tuple[int, int]:
    """(tokens, sequences) of the optimizer step the call's micro-batch belongs to.

    The count of the loss's own aggregation is the call's ``normalizer`` when given (the kit's
    global denominator, or one imposed as in the golden vectors); otherwise, and for the other
    count (the KL loss is always a token mean), the kit's ``global_tokens`` / ``global_sequences``,
    else the call's own counts.
    """
    mask = call.mask
    tokens = getattr(call, "global_tokens", None)
    sequences = getattr(call, "global_sequences", None)
    tokens = int(mask.sum()) if tokens is None else tokens
    sequences = int(mask.any(dim=-1).sum()) if sequences is None else sequences
    if call.normalizer is not None:
        if call.normalizer != round(call.normalizer):
            raise ValueError(
                f"call.normalizer: OpenRLHF counts whole tokens / sequences, got {call.normalizer}"
            )
        if token_level:
            tokens = int(round(call.normalizer))
        else:
            sequences = int(round(call.normalizer))
    return int(tokens), int(sequences)


def _loss_batch_info(call, loss_utils, token_level: bool) -> tuple[dict, int]:
    """(``loss_batch_info``, gas) for one micro-batch from OpenRLHF's ``_optimizer_step_loss_norm``
    (``iter_grad_accum_global_norm``'s normalisers: the step's token and non-empty-sequence counts
    summed over its micro-batch masks and divided by ``gas``, the kit's ``micro_batch_count``, in
    float32). It is given masks that carry the step's counts (``_step_counts``): one row of
    ``tokens`` ones for ``batch_num_tokens``, ``sequences`` one-token rows for ``global_batch_size``.
    """
    import torch

    gas = int(getattr(call, "micro_batch_count", 1) or 1)
    if not hasattr(loss_utils, "_optimizer_step_loss_norm"):  # OpenRLHF < 0.10.4: each micro-batch
        # normalised by its own counts (training_step's get_loss_batch_info; modes.RELEASE_FLAGS)
        return loss_utils.get_loss_batch_info(None, call.mask.to(torch.long)), gas
    tokens, sequences = _step_counts(call, token_level)

    def norm(rows: int, cols: int, key: str):
        carrier = torch.ones((rows, cols), dtype=torch.long) if rows and cols else torch.zeros((1, 1))
        return loss_utils._optimizer_step_loss_norm([carrier], None, 1, gas)[key].to(call.logp.device)

    info = {
        "dp_size": 1,
        "batch_num_tokens": norm(1, tokens, "batch_num_tokens"),
        "global_batch_size": norm(sequences, 1, "global_batch_size"),
    }
    return info, gas


def _takes_old(compute_approx_kl) -> bool:
    """Whether ``compute_approx_kl`` has ``log_probs_old`` (OpenRLHF 0.11.2 has; 0.10.4's has not)."""
    import inspect

    return "log_probs_old" in inspect.signature(compute_approx_kl).parameters


def _policy_target(variant) -> tuple[Callable, Callable]:
    mods = _modules()
    kwargs = policy_loss_kwargs(variant)
    loss_fn = mods["loss"].PolicyLoss(**kwargs)
    kl_coef, estimator = float(variant.kl_coef), variant.kl_estimator

    def adapter(fn, call):
        import torch

        action_mask = call.mask.to(torch.long)  # the sample generator's integer action_mask
        advantages = call.advantages
        if advantages.ndim == 1:  # OpenRLHF's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        info, gas = _loss_batch_info(call, mods["loss_utils"], kwargs.get("token_level_loss", False))
        loss = fn(call.logp, call.old_logp, advantages, action_mask=action_mask, **info)[0]
        if kl_coef > 0:  # training_step with algo.kl.use_loss: loss = actor_loss + kl_loss * kl_ctl
            if call.ref_logp is None:
                raise ValueError("call.ref_logp is required when variant.kl_coef > 0")
            old = {"log_probs_old": call.old_logp} if _takes_old(mods["utils"].compute_approx_kl) else {}
            kl = mods["utils"].compute_approx_kl(call.logp, call.ref_logp, kl_estimator=estimator, **old)
            loss = loss + mods["loss"].aggregate_loss(kl, action_mask, **info) * kl_coef
        # DeepSpeed engine.backward -> _scale_loss_by_gas: loss / gradient_accumulation_steps()
        return loss / gas

    adapter.scaled_for_accumulation = True  # the division by gas above (micro_batch="local_mean")
    return loss_fn, adapter


def _kl_target(mode: Mode) -> tuple[Callable, Callable]:
    mods = _modules()
    estimator = mode.variant_overrides["kl_estimator"]

    def adapter(fn, logp, ref_logp):
        return fn(logp, ref_logp, kl_estimator=estimator)

    return mods["utils"].compute_approx_kl, adapter


def target(kind: str, mode: str | Mode, variant=None) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` driving OpenRLHF's own code for ``mode`` of ``kind``.

    policy_loss: ``fn`` is a constructed ``PolicyLoss`` module (for ``variant``, default the mode's
    preset with its overrides) and ``adapter(fn, call)`` returns the micro-batch's share of the
    loss. kl: ``fn`` is ``compute_approx_kl`` and ``adapter(fn, logp, ref_logp)`` the per-token value.
    """
    _check_kind(kind)
    m = _mode(kind, mode)
    if kind == "policy_loss":
        return _policy_target(_mode_variant(m) if variant is None else variant)
    if kind == "kl":
        return _kl_target(m)
    raise ValueError(f"kind {kind!r}: {unsupported_modes(kind)}")
