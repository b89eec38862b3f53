"""Findings: what a driver reports about its framework's code beyond its profile's flags, each with a
class that says whether it matters for training, the line it sits on (verified against the installed
source by tests/test_framework_findings.py), the releases affected and the upstream thread where one
exists. The matrix lists them (docs/conformance-matrix.md, "Findings") with the modes that show them.

The classes (``FINDING_KINDS``):

* ``bug``: changes training: the optimised loss or its gradient departs from the spec in a way the
  framework's own documentation does not choose;
* ``value_only``: a logged value departs (e.g. NaN) while the gradient is right;
* ``documented_default``: a documented default that departs from the paper's formula (a user who sets
  the option gets the paper's), or a documented choice no option undoes (the framework's docs state
  what it computes, e.g. OpenRLHF's dr_grpo estimator as Dr. GRPO's advantage without its normaliser:
  the finding's text says that no option gives the paper's);
* ``subgradient``: a choice of subgradient where the loss has a kink, e.g. PyTorch's ``torch.max`` /
  ``torch.min`` splitting the gradient at a tie: any value between the one-sided derivatives is a
  subgradient, so it is **not a bug**; the kit names it so that nobody files it as one (and its judge
  accepts any value of the subdifferential, with a note);
* ``autodiff_tie``: automatic differentiation's value on an exact floating-point tie where the loss is
  differentiable (e.g. ``jnp.clip``'s half derivative at a bound carried through the chain rule): not a
  subgradient of the spec's loss, but a value on a set of inputs of measure zero, which an automatic
  differentiation system may return (an element of a conservative field, Bolte & Pauwels 2021) and
  training meets with probability zero; **not a bug to file**, named so that nobody does;
* ``validation``: a setting that makes no sense (a dual clip inside the clip band, responses longer
  than the length the loss divides by, reference log-probs given and dropped) accepted without an
  error or a warning. Its key is ``config:<parameter>``; like a bug it has a standalone script
  (``repro.py``) that shows the setting accepted.

A driver module lists ``FINDINGS: tuple[Finding, ...]``; ``key`` ties a finding to the departures that
show it (a flag, ``flag=value`` as the matrix writes it, or a case class). A finding of some releases
other than the pinned one only (a departure no flag reproduces, fixed by the pinned release) is listed
in ``RELEASE_FINDINGS = {version: (Finding, ...)}`` beside the module's ``RELEASE_FLAGS``
(releases.py), and is one of its findings when that release is installed. Modules written against the
earlier ``CANDIDATE_BUGS = {key: text}`` are read as findings of class ``bug``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["FINDING_KINDS", "REPRODUCED_KINDS", "Finding", "as_findings", "dual_clip_tie_finding",
           "ratio_overflow_finding", "zero_rows_finding"]

FINDING_KINDS = {
    "bug": "changes training",
    "value_only": "a logged value departs, the gradient is right",
    "documented_default": "a documented default departs from the paper",
    "subgradient": "a valid subgradient at a kink, not a bug",
    "autodiff_tie": "automatic differentiation's value on an exact float tie (measure zero), not a bug",
    "validation": "a nonsensical setting accepted silently",
}
#: the classes whose findings have a standalone script (repro.py)
REPRODUCED_KINDS = ("bug", "validation")


@dataclass(frozen=True)
class Finding:
    """One finding (module docstring). ``where`` is ``path:LINE`` relative to the installed package's
    folder and ``quote`` a fragment of that line, so that the line can be checked; ``affected`` the
    releases it was verified in, ``fixed_in`` where it is fixed, ``upstream`` the thread; ``function``
    the ``def`` enclosing the line, where the quoted code also occurs in another function of the file
    (verl's deprecated ``compute_policy_loss`` repeats ``compute_policy_loss_vanilla``'s lines), so that
    the check cannot pass on the wrong one of two identical lines."""

    key: str
    kind: str
    text: str
    where: str = ""
    quote: str = ""
    affected: str = ""
    fixed_in: str = ""
    upstream: str = ""
    function: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FINDING_KINDS:
            raise ValueError(f"Finding.kind: expected one of {sorted(FINDING_KINDS)}, got {self.kind!r}")
        if bool(self.where) != bool(self.quote):
            raise ValueError(f"Finding {self.key!r}: where and quote go together (the line is checked)")
        if self.function and not self.where:
            raise ValueError(f"Finding {self.key!r}: function names the def around where's line")

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.function:  # only where a quote needs it (the matrix's records are unchanged otherwise)
            del out["function"]
        return out


def dual_clip_tie_finding(where: str, quote: str, affected: str, function: str = "") -> Finding:
    """The finding of ``dual_clip_tie="half"``: a ``torch.max`` / ``torch.min`` tie at a ratio exactly on
    the dual clip (A < 0) gives half of each branch's gradient, ``A r / 2``; the loss has a kink there
    and every value between the one-sided derivatives (0 and ``A r``) is a subgradient."""
    return Finding(
        "dual_clip_tie", "subgradient",
        "at a ratio exactly on the dual clip (A < 0) the gradient is A r / 2, the average of the two "
        "one-sided derivatives (PyTorch's choice at a max / min tie); a valid subgradient of the kink, "
        "not a bug (the spec's inclusive gate keeps A r).",
        where=where, quote=quote, affected=affected, function=function,
    )


def ratio_overflow_finding(where: str, quote: str, affected: str, function: str = "",
                           upstream: str = "", extra: str = "") -> Finding:
    """The finding of ``ratio_overflow="nan"``: ``exp`` of the raw log-ratio overflows to inf above 88.72
    in float32 (and bf16); a closed gate then multiplies its zero derivative by inf: NaN. ``extra``: a
    sentence on the framework's own gates (e.g. a soft gate that saturates)."""
    return Finding(
        "ratio_overflow", "bug",
        "exp of the unclamped log-ratio is inf above 88.72 in float32: with a closed gate (A > 0 beyond "
        "1 + eps_high) the exact gradient is 0, but the clamp's zero derivative times exp's inf is NaN, "
        "and one NaN token poisons the step's gradient (a stale or mismatched old log-prob suffices)."
        + (" " + extra if extra else ""),
        where=where, quote=quote, affected=affected, function=function, upstream=upstream,
    )


def zero_rows_finding(where: str, quote: str, affected: str) -> Finding:
    """The finding of ``zero_rows="nan"``: a mean over the rows of a batch without rows is 0 / 0; the
    gradient w.r.t. the (empty) log-probs is empty, so only the logged value is NaN."""
    return Finding(
        "zero_rows", "value_only",
        "a batch with no rows (the empty micro-batch of an uneven split) gives a NaN loss: a mean over 0 "
        "rows; the gradient w.r.t. the empty log-probs has no entry, so training is unchanged, but the "
        "NaN reaches the logged loss.",
        where=where, quote=quote, affected=affected,
    )


def as_findings(module, version: str | None = None) -> tuple[Finding, ...]:
    """A driver module's ``FINDINGS`` (or its earlier ``CANDIDATE_BUGS`` read as bugs), then those its
    ``RELEASE_FINDINGS`` list for the installed release ``version``."""
    release = tuple(getattr(module, "RELEASE_FINDINGS", {}).get(version or "", ()))
    findings = getattr(module, "FINDINGS", None)
    if findings is not None:
        return tuple(findings) + release
    legacy = getattr(module, "CANDIDATE_BUGS", {})
    return tuple(Finding(key, "bug", text) for key, text in legacy.items()) + release
