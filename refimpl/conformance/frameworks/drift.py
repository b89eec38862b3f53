"""``refimpl frameworks drift``: the matrix of each framework at several releases, and what changed
between them (docs/conformance-drift.md, ``make drift``).

For every framework, ``RELEASES`` names the releases compared (oldest first: the previous minor
release, the pinned one and the newest on the registry, or all that exist). Each release other than
the pinned one is installed into a directory of its own (``install.install_release``: ``pip install
--no-deps --target``) and the same driver runs the matrix on it in a process whose ``PYTHONPATH``
starts with that directory (``releases.release_env``); the pinned release is the one installed in the
environment. A driver states what a release computes differently as data (``RELEASE_FLAGS``,
releases.py), and the matrix checks that the release passes under it.

Between consecutive releases the document lists, per framework and mode: modes added or removed (a
mode is present when its driver runs it without an error), profile flags gained, lost or changed,
case classes that fail under the release's profile (a change no flag of the kit reproduces), and
findings introduced or fixed (a finding is present in a release when its driver lists it there, when
its key is a flag a mode's profile of that release holds it, and when it cites a line its quoted
code occurs in that file of the release: ``locate_findings``; the kit verified the line on the
pinned release only, and an older release whose file lacks the code is not said to have the
finding). ``SUCCESSORS`` chains a package to its successor (SkyRL-train -> skyrl): a finding of the
predecessor's last release that its ``affected`` says holds in a release of the successor package
(``named_releases``; the fact has one home, the predecessor's finding) is present in the successor's
releases up to the newest it names, whether or not the successor's driver lists it, so that it is
not reported fixed there. A failing class whose name is the key of a finding the driver lists for
that release (a release-specific finding, findings.py's ``RELEASE_FINDINGS``: a departure no flag of
the kit reproduces, with its verified line) is written with that finding; any other failure is
written as unexplained. ``CHANGES`` says in words what each change is, each statement checked
against both releases' installed code.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

from . import EXTRA_FRAMEWORKS, FRAMEWORKS, PACKAGES, load_driver
from .releases import install_release, release_dir, release_env

__all__ = ["RELEASES", "SUCCESSORS", "CHANGES", "release_row", "compare", "drift_data", "drift_markdown",
           "named_releases", "register"]

#: the releases compared per framework, oldest first (each driver's PINNED_VERSION among them)
RELEASES: dict[str, tuple[str, ...]] = {
    "trl": ("1.14.2", "1.15.0", "1.16.0"),
    "verl": ("0.8.0", "0.9.0", "0.9.1"),
    "openrlhf": ("0.10.3", "0.10.4", "0.11.2"),
    # 0.7.0, the previous minor release, has neither delta nor use_bias_correction_kl nor luspo, and its
    # chunk_forward returns the vocabulary's log-softmax: the driver knows both signatures
    "liger": ("0.7.0", "0.8.0", "0.8.4", "0.8.5"),
    "skyrl": ("0.2.0", "0.3.0", "0.3.1"),
    "skyrl_pkg": ("0.3.0", "0.4.0"),
    "areal": ("1.0.4",),
    "unsloth": ("2026.9.9", "2026.10.8", "2026.10.9"),
    # before 0.1.7 the losses lived in grpo/grpo_learner.py and ppo/ppo_helpers.py (no rl/algo_core.py),
    # modules that import the whole RL cluster: the driver runs 0.1.7's layout only (CHANGES says so)
    "tunix": ("0.1.6", "0.1.7"),
}
#: a package replaced by another: its last release is compared with the successor's first
SUCCESSORS = {"skyrl": "skyrl_pkg"}
#: (framework, release) -> what changed there, in words (checked against both releases' code)
CHANGES: dict[tuple[str, str], str] = {
    ("verl", "0.9.1"): "compute_policy_loss_gspo aggregates with the configured loss_agg_mode "
    "(trainer/ppo/core_algos.py:1603-1606); 0.9.0 (core_algos.py:1603-1605) and 0.8.0 passed "
    "loss_agg_mode=\"seq-mean-token-mean\" whatever the config (mode gspo/token-mean: flag "
    "fixed_aggregation before 0.9.1).",
    ("openrlhf", "0.10.4"): "the loss normalisers are the optimizer step's (utils/loss_utils.py: "
    "_optimizer_step_loss_norm, iter_grad_accum_global_norm): 0.10.3 normalised each micro-batch by "
    "its own tokens (micro_batch local_mean), so a micro-batch without tokens made the step's loss and "
    "gradient NaN (0 / 0; case class padding_micro_batch: 0.10.3's finding, utils/loss_utils.py:33) and "
    "one without rows raised (loss_mask.reshape(0, -1), loss_utils.py:40: zero_rows 'raise'); from "
    "0.10.4 only a step without any token is NaN (empty_step nan).",
    ("openrlhf", "0.11.2"): "compute_approx_kl takes log_probs_old and clamps log(pi / pi_ref) "
    "below at -10 before exp (models/utils.py:69-72, 108); 0.10.4's has neither (flag kl_log_ratio_max "
    "gained). PolicyLoss's train/rollout correction is is_correction_level / _mode / _threshold "
    "(models/loss.py:128-131) where 0.10.4 had enable_vllm_is_correction with vllm_is_correction_type "
    "'tis' / 'icepop' (loss.py:128-130; the driver knows both), and its 'mask' action keeps the weight with "
    "torch.where (loss.py:239) where ICEPOP multiplied it by the band (0.10.4 loss.py:205): inf * 0 at a "
    "padding position whose rollout log-prob is -inf no longer makes the loss NaN (finding "
    "masked_nonfinite fixed).",
    ("liger", "0.8.0"): "LigerFusedLinearGRPOLoss takes delta (the dual clip of A < 0) and "
    "use_bias_correction_kl (chunked_loss/grpo_loss.py:428-429) and loss_type 'luspo' (grpo_loss.py:238), "
    "and its chunk_forward returns the selected tokens' log-probs (fused_linear_ppo.py:502) where 0.7.0's "
    "returned the log-softmax over the vocabulary (fused_linear_ppo.py:361): modes dapo/delta, luspo and "
    "dapo+kl/bias-correction added.",
    ("liger", "0.8.4"): "forward takes num_items_in_batch (chunked_loss/fused_linear_ppo.py:460): dapo and "
    "cispo divide by the step's tokens; 0.8.0 and 0.7.0 divided by each call's own (flag micro_batch "
    "'local_mean' before 0.8.4).",
    ("unsloth", "2026.10.9"): "grpo_compute_loss's bnpo divides by the micro-batch's own tokens even when "
    "TRL passes the global count (unsloth_zoo/rl_replacements.py:1226-1228; 2026.10.8 divided by "
    "num_items_in_batch, :1120-1125: finding bnpo_local_count introduced, flag micro_batch local_mean), "
    "and the k3 term is clamped to [-10, 10] after its importance weight (:1141-1144; before it in "
    "2026.10.8, :1028: kl_value_clamp_scope 'weighted').",
    ("tunix", "0.1.7"): "the losses and estimators moved to rl/algo_core.py (grpo_loss_fn at "
    "algo_core.py:342, compute_gae_advantages at :34, masked_whiten at :116), which imports jax, flax, "
    "rl/common.py and rl/function_registry.py; 0.1.6 has them in rl/grpo/grpo_learner.py:433 and "
    "rl/ppo/ppo_helpers.py:27, 109, whose imports pull in the whole RL cluster (rl_cluster, rl_learner, "
    "tunix.generate): the driver runs "
    "0.1.7's layout only, so 0.1.6 is not driven.",
    ("skyrl_pkg", "0.3.0"): "SkyRL-train's losses in the skyrl package: compute_approx_kl without "
    "@torch.no_grad() (the KL loss has its gradient: SkyRL-train finding kl_gradient fixed; its kept k3 "
    "clamp now zeroes that gradient where k3 > 10: kl_value_clamp), the reduction folded into the "
    "advantages over the mini-batch (micro_batch global) and each policy loss a masked sum, so a batch "
    "without rows gives 0 (SkyRL-train's zero_rows fixed for the policy losses; the KL loss keeps its "
    "mean over rows, backends/skyrl_train/workers/worker.py:977, as SkyRL-train's worker.py:686 had it: "
    "zero_rows='nan'), and max_seq_len must be set for seq_mean_token_sum_norm "
    "(train/utils/utils.py:379) where SkyRL-train's trainer set it to the prompt plus the response budget "
    "(utils/utils.py:278: seq_sum_extra fixed). Modes removed are modes the skyrl_pkg driver does not "
    "run (its UNSUPPORTED and KIND_MODES), not code the package dropped.",
    ("skyrl_pkg", "0.4.0"): "CISPOConfig.cispo_eps_clip_low defaults to 1.0 (train/config/config.py:832; "
    "0.0 in 0.3.0, config.py:543): the CISPO weight is no longer clipped below at 1 (finding "
    "cispo_clip_low fixed); cispo_eps_clip_high to 4.0 (config.py:837; 5.0 in 0.3.0, config.py:545), "
    "both documented as ScaleRL's recipe (finding cispo_eps_clip_high, a documented default); and "
    "compute_policy_loss_cispo logs ratio.max() (backends/skyrl_train/utils/ppo_utils.py:804), which "
    "raises on a batch without rows (zero_rows='raise').",
}

DOC = pathlib.Path("docs/conformance-drift.md")


def release_row(name: str, version: str, *, workdir: pathlib.Path) -> dict:
    """The matrix row of ``name`` at ``version`` (the environment's install when it is the pinned
    release, else its own directory), or ``{"framework", "available": False, "reason"}``."""
    driver = load_driver(name)
    env = None
    if version != driver.pinned_version or driver.installed_version() != version:
        try:
            env = release_env(pathlib.Path(install_release(name, version, quiet=True)))
        except RuntimeError as exc:
            return {"framework": name, "available": False, "reason": str(exc)}
    out = workdir / f"{name}-{version}.json"
    command = [sys.executable, "-m", "refimpl", "matrix", "--framework", name, "--partial",
               "--out", str(out.with_suffix(".md")), "--json", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"framework": name, "available": False, "reason": f"refimpl matrix failed: {tail}"}
    (row,) = json.loads(out.read_text())["frameworks"]
    return row


def _modes(row: dict) -> dict[str, dict]:
    return {f"{m['kind']}:{m['mode']}": m for m in row.get("modes", []) if "error" not in m}


def _present_findings(row: dict) -> set[str]:
    """The findings of a release: those its driver lists there whose key, when it is a flag, some
    mode's profile of that release holds (a release whose RELEASE_FLAGS drop the flag is fixed) and
    whose quoted code that release's file holds (``located`` not False: ``locate_findings``), and those a
    predecessor package's findings carry into it (``row["carried"]``, ``_carried``)."""
    from ..conventions import FLAGS

    modes = list(_modes(row).values())
    return {f["key"] for f in row.get("findings", []) if f.get("located") is not False
            and (f["key"].split("=")[0] not in FLAGS or any(_held(f["key"], m["profile"]) for m in modes))
            } | set(row.get("carried", ()))


def package_root(name: str, version: str) -> pathlib.Path | None:
    """The folder of framework ``name``'s package at release ``version``: the environment's where that
    release is the installed one, else the release's own directory (``releases.release_dir``); None
    where neither holds it."""
    import importlib.util

    driver = load_driver(name)
    if driver.installed_version() == version:
        spec = importlib.util.find_spec(PACKAGES[name])
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        return pathlib.Path(locations[0]) if locations else None
    root = release_dir(_distribution(name), version) / PACKAGES[name]
    return root if root.is_dir() else None


def locate_findings(row: dict, root: pathlib.Path | None) -> dict:
    """``row`` with ``located`` on each finding that cites a line (``where``, ``quote``): whether the quoted
    code occurs in that file under ``root`` at all (a line number moves between releases; the pinned
    release's exact line is checked by tests/test_framework_findings.py). Unchanged without ``root``."""
    if root is None:
        return row
    findings = []
    for finding in row.get("findings", []):
        if finding.get("where"):
            path = root / finding["where"].rsplit(":", 1)[0]
            text = path.read_text(errors="replace") if path.is_file() else ""
            finding = {**finding, "located": finding["quote"] in text}
        findings.append(finding)
    return {**row, "findings": findings} if findings else row


_VERSION = r"\d+(?:\.\d+)+"


def named_releases(affected: str, distribution: str) -> list[str]:
    """The releases of ``distribution`` that a finding's ``affected`` names: ``"skyrl-train 0.3.1;
    skyrl 0.3.0, 0.4.0 (ppo_utils.py:960)"`` gives ``["0.3.0", "0.4.0"]`` for ``"skyrl"`` (the name
    followed by a space, so that ``skyrl-train`` is another distribution)."""
    pattern = rf"(?<![\w.-]){re.escape(distribution)} ({_VERSION}(?:, {_VERSION})*)"
    return [v for match in re.finditer(pattern, affected) for v in match.group(1).split(", ")]


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _carried(last: dict, distribution: str, versions: list[str]) -> dict[str, list[str]]:
    """``{successor release: [finding keys]}``: the findings present in the predecessor's last release
    ``last`` whose ``affected`` names releases of the successor's ``distribution``, each in every
    successor release up to the newest it names (it holds in the predecessor and in that release)."""
    present = _present_findings(last)
    out: dict[str, list[str]] = {v: [] for v in versions}
    for finding in last.get("findings", []):
        named = named_releases(finding.get("affected", ""), distribution)
        if finding["key"] not in present or not named:
            continue
        newest = max(_release_key(v) for v in named)
        for v in versions:
            if _release_key(v) <= newest and finding["key"] not in out[v]:
                out[v].append(finding["key"])
    return out


def _distribution(name: str) -> str:
    """The distribution a driver installs (its ``DISTRIBUTION``, else its name), as releases.py reads it."""
    from . import load_driver

    return getattr(load_driver(name).module, "DISTRIBUTION", name)


def _held(key: str, profile: dict) -> bool:
    """A finding's flag key (``flag`` or ``flag='value'`` as the matrix writes it) held by ``profile``."""
    name, _, value = key.partition("=")
    return name in profile and (not value or value == repr(profile[name]))


def _errors(row: dict) -> list[str]:
    return [f"{m['kind']}:{m['mode']}: {m['error']}" for m in row.get("modes", []) if "error" in m]


def compare(old: dict, new: dict) -> dict:
    """What changed from the release row ``old`` to ``new`` (module docstring)."""
    before, after = _modes(old), _modes(new)
    flags = {}
    for key in sorted(set(before) & set(after)):
        a, b = before[key]["profile"], after[key]["profile"]
        change = {f: [a.get(f), b.get(f)] for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)}
        if change:
            flags[key] = change
    found_old, found_new = _present_findings(old), _present_findings(new)
    failing = _failing(new)
    return {
        "modes_added": sorted(set(after) - set(before)),
        "modes_removed": sorted(set(before) - set(after)),
        "flags_changed": flags,
        "failing": failing,
        "explained": _explained(new, failing),
        "findings_introduced": sorted(found_new - found_old),
        "findings_fixed": sorted(found_old - found_new),
    }


def _explained(row: dict, failing: dict[str, list[str]]) -> list[str]:
    """The failing classes that a finding listed in the release ``row`` is keyed by (a release-specific
    finding: findings.py's RELEASE_FINDINGS)."""
    listed = {f["key"] for f in row.get("findings", [])}
    return sorted({c for classes in failing.values() for c in classes} & listed)


def _failing(row: dict) -> dict[str, list[str]]:
    """``{mode: [case classes]}`` of the modes of ``row`` that fail under the release's profile."""
    return {key: sorted(c for c, s in m["own"]["classes"].items() if s == "FAIL")
            for key, m in _modes(row).items() if not m["own"]["ok"]}


def drift_data(rows: dict[str, dict[str, dict]]) -> dict:
    """``{framework: {"releases": [...], "steps": [...]}}`` from ``rows[framework][version]``."""
    rows = _with_carried(rows)
    out = {}
    for name, by_version in rows.items():
        versions = list(by_version)
        chain = [(name, v) for v in versions]
        steps = []
        for (n0, v0), (n1, v1) in zip(chain, chain[1:], strict=False):
            a, b = by_version[v0], by_version[v1]
            step = {"from": f"{n0} {v0}", "to": f"{n1} {v1}"}
            if a.get("available") and b.get("available"):
                step.update(compare(a, b))
            else:
                step["unavailable"] = a.get("reason") or b.get("reason")
            step["changes"] = [text for (fw, key), text in CHANGES.items()
                               if fw == n1 and key.split("+")[0] == v1]
            steps.append(step)
        out[name] = {"releases": [{"version": v, "available": r.get("available", False),
                                   "reason": r.get("reason"), "modes": len(_modes(r)),
                                   "passing": sum(1 for m in _modes(r).values() if m["own"]["ok"]),
                                   "errors": _errors(r),
                                   "failing": _failing(r),
                                   "explained": _explained(r, _failing(r)),
                                   "findings": sorted(_present_findings(r))}
                                  for v, r in by_version.items()],
                     "steps": steps}
    for old, new in SUCCESSORS.items():
        if old in rows and new in rows and rows[old] and rows[new]:
            v0, v1 = list(rows[old])[-1], list(rows[new])[0]
            a, b = rows[old][v0], rows[new][v1]
            step = {"from": f"{old} {v0}", "to": f"{new} {v1}", "successor": True}
            if a.get("available") and b.get("available"):
                step.update(compare(a, b))
                listed = {f["key"] for f in b.get("findings", [])}
                step["findings_carried"] = sorted(set(b.get("carried", ())) - listed)
            step["changes"] = [text for (fw, key), text in CHANGES.items() if fw == new and key == v1]
            out[new]["steps"].insert(0, step)
    return out


def _with_carried(rows: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """``rows`` with each successor's available rows given ``"carried"``: the predecessor's findings
    present there by their ``affected`` (``_carried``); the input is left as it is."""
    out = dict(rows)
    for old, new in SUCCESSORS.items():
        if not rows.get(old) or not rows.get(new):
            continue
        last = list(rows[old].values())[-1]
        if not last.get("available"):
            continue
        carried = _carried(last, _distribution(new), list(rows[new]))
        out[new] = {v: {**row, "carried": carried[v]} if row.get("available") else row
                    for v, row in rows[new].items()}
    return out


def _step_lines(step: dict) -> list[str]:
    head = f"- **{step['from']} -> {step['to']}**"
    head += " (successor package)" if step.get("successor") else ""
    if "unavailable" in step:  # what changed in words all the same
        changes = [f"  - {text}" for text in step.get("changes", [])]
        return [head + f": not compared ({step['unavailable']})", *changes]
    lines = [head + ":"]
    for text in step.get("changes", []):
        lines.append(f"  - {text}")
    for what in ("modes_added", "modes_removed", "findings_introduced", "findings_fixed"):
        if step.get(what):
            lines.append(f"  - {what.replace('_', ' ')}: {', '.join(step[what])}")
    if step.get("findings_carried"):
        lines.append("  - findings kept (the predecessor's findings whose `affected` names this package; "
                     f"its driver does not list them): {', '.join(step['findings_carried'])}")
    for key, change in step.get("flags_changed", {}).items():
        parts = ", ".join(f"`{f}` {a!r} -> {b!r}" for f, (a, b) in change.items())
        lines.append(f"  - `{key}`: {parts}")
    for key, classes in step.get("failing", {}).items():
        lines.append("  - " + _failing_text(key, classes, step.get("explained", ())))
    if len(lines) == 1:
        lines[0] = head + ": no change the kit sees"
    return lines


def _failing_count(release: dict) -> str:
    """`` (n fail by the release's findings, m unexplained)`` for the summary; "" when none fails."""
    failing = release.get("failing", {})
    if not failing:
        return ""
    unexplained = sum(1 for classes in failing.values() if set(classes) - set(release["explained"]))
    parts = [f"{len(failing) - unexplained} fail by its findings"] if len(failing) > unexplained else []
    parts += [f"{unexplained} unexplained"] if unexplained else []
    return f" ({', '.join(parts)})"


def _failing_text(key: str, classes: list[str], findings) -> str:
    """A failing mode in words: its classes keyed by a finding of the release are that finding's
    departure (its line verified in the matrix's findings); the others are unexplained."""
    known = [c for c in classes if c in findings]
    unknown = [c for c in classes if c not in findings]
    text = f"`{key}` fails {', '.join(classes)} under its profile"
    if known:
        text += f": finding{'s' if len(known) > 1 else ''} {', '.join(known)} of this release"
    if unknown and known:
        text += f"; {', '.join(unknown)} unexplained (no flag or finding reproduces it)"
    elif unknown:
        text += " (no flag or finding reproduces it)"
    return text


def drift_markdown(data: dict) -> str:
    """docs/conformance-drift.md: the one-screen summary, then each framework's steps."""
    lines = ["# Conformance drift across releases", "",
             "Generated by `make drift` (`refimpl frameworks drift`;",
             "refimpl/conformance/frameworks/drift.py):",
             "each release installed into its own directory, the same drivers, the matrix under each",
             "release's profile. A finding is present in a release when the release's file holds its",
             "quoted code (the kit checks the exact line on the pinned release only). Do not edit by hand.",
             "", "## Summary", "",
             "| framework | release: modes passing / driven, findings present |", "| --- | --- |"]
    for name, entry in data.items():
        cells = []
        for r in entry["releases"]:
            if not r["available"]:
                cells.append(f"{r['version']}: not driven")
            else:
                found = f", {', '.join(r['findings'])}" if r["findings"] else ""
                cells.append(f"{r['version']}: {r['passing']}/{r['modes']}{_failing_count(r)}{found}")
        lines.append(f"| {name} | {'; '.join(cells)} |")
    lines += [""]
    for name, entry in data.items():
        lines += [f"## {name}", ""]
        for step in entry["steps"]:
            lines += _step_lines(step)
        if len(entry["releases"]) == 1:
            only = entry["releases"][0]["version"]
            lines.append(f"- one release on the registry, {only}: nothing to compare")
        for r in entry["releases"]:
            if not r["available"]:
                lines.append(f"- {name} {r['version']}: not driven ({r['reason']})")
            elif r["errors"]:
                lines.append(f"- {name} {r['version']}: {len(r['errors'])} mode(s) the driver cannot run "
                             f"there, e.g. {r['errors'][0]}")
            if r.get("failing") and r is entry["releases"][0]:
                for key, classes in r["failing"].items():
                    lines.append(f"- {name} {r['version']}: " + _failing_text(key, classes, r["explained"]))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def run_drift(args: argparse.Namespace) -> int:
    """``refimpl frameworks drift [NAME ...] [--out PATH] [--cache DIR]``: the named frameworks (default
    all) measured again, the others' rows read from the cache of an earlier run."""
    names = tuple(args.names or RELEASES)
    unknown = [n for n in names if n not in FRAMEWORKS + EXTRA_FRAMEWORKS or n not in RELEASES]
    if unknown:
        print(f"refimpl frameworks drift: no releases listed for {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, dict]] = {}
    cache = pathlib.Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rl-oracle-drift-") as tmp:
        for name in RELEASES:  # every framework: the named ones measured, the others from the cache
            for version in RELEASES[name]:
                cached = cache / f"{name}-{version}.json"
                if name in names:
                    print(f"drift: {name} {version}", file=sys.stderr, flush=True)
                    row = release_row(name, version, workdir=pathlib.Path(tmp))
                    cached.write_text(json.dumps(row))
                elif cached.exists():
                    row = json.loads(cached.read_text())
                else:
                    continue
                if row.get("available", True):
                    row = locate_findings(row, package_root(name, version))
                rows.setdefault(name, {})[version] = row
    data = drift_data(rows)
    out = pathlib.Path(args.out)
    out.write_text(drift_markdown(data))
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``refimpl frameworks drift`` to the ``frameworks`` subcommands."""
    drift = sub.add_parser("drift", help="the matrix at several releases of each framework, what changed",
                           description="Install each release of RELEASES into its own directory, run the "
                           "matrix on it and write what changed (docs/conformance-drift.md).")
    drift.add_argument("names", nargs="*", metavar="NAME")
    drift.add_argument("--out", default=str(DOC), help=f"the Markdown (and .json beside it; default {DOC})")
    drift.add_argument("--cache", default=".frameworks-releases/drift-rows",
                       help="each release's matrix row (frameworks not named are read from here)")
    drift.set_defaults(func=run_drift)
