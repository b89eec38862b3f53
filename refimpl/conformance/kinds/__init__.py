"""The kind registry: every kind the kit checks through one generic loop (``base.run_kind_check``).

``KIND_REGISTRY`` maps a kind's name to its ``Kind`` (base.py): its case classes, its flags (a
frozen dataclass whose defaults are the spec), its expected values (from the verified reference in
``refimpl``) and how a function of the kind is called. Adding a kind: one module in this folder
defining a ``Kind`` (its cases and its expected values live there, nowhere else) and one entry
below; the command line (``refimpl check kind NAME``), the framework drivers (``KIND_MODES``) and the
matrix pick it up from here (docs/conformance.md, "Adding a kind").

The kinds older than the registry (policy loss, KL estimators, group advantages, token log-probs)
keep their own checkers (``policy_check``, ``simple_checks``) on the same engine loop.
"""

from __future__ import annotations

import dataclasses

from .base import Kind, KindCase, attribute, run_kind_check
from .behavior import BEHAVIOR
from .fused_linear import FUSED_LINEAR
from .gae import GAE
from .kl_reward import KL_REWARD
from .overlong import OVERLONG
from .value_loss import VALUE_LOSS
from .whitening import WHITENING

__all__ = ["KIND_REGISTRY", "REGISTRY_KINDS", "KIND_FLAGS", "Kind", "KindCase", "get_kind", "run_kind_check",
           "attribute"]

#: every kind of the registry, in report order
KIND_REGISTRY: dict[str, Kind] = {k.name: k for k in (GAE, VALUE_LOSS, WHITENING, KL_REWARD, BEHAVIOR,
                                                     FUSED_LINEAR, OVERLONG)}
REGISTRY_KINDS: tuple[str, ...] = tuple(KIND_REGISTRY)
#: every flag of the registry's kinds (a finding may be keyed by one, as by a policy-loss flag)
KIND_FLAGS: tuple[str, ...] = tuple(f.name for kind in KIND_REGISTRY.values()
                                    for f in dataclasses.fields(kind.flags))


def get_kind(name: str) -> Kind:
    """The registry's kind ``name``; ValueError naming the kinds."""
    if name not in KIND_REGISTRY:
        raise ValueError(f"kind must be one of {REGISTRY_KINDS}, got {name!r}")
    return KIND_REGISTRY[name]
