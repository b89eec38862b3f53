"""The conformance matrix: framework x mode x case class, under each mode's own profile and under
the reference (``refimpl matrix``; docs/conformance-matrix.md).

For every framework driver (``refimpl.conformance.frameworks``) and every mode in scope, the kit
runs twice: under the mode's profile (``Mode.convention``: must pass every class) and under the
reference convention, where each failing class is a *departure* from the spec, explained by the
mode's flag that reproduces the framework's value exactly (a policy loss: on the class's smallest
failing case; other kinds: the class passes under the reference with that flag; see
``checks.check_framework_mode``) or ``unexplained``. Modes out of scope are listed with the driver's
reason, frameworks that are not installed as such. Expected values never come from the framework:
a profile is data applied to the reference implementation.
"""

from __future__ import annotations

import dataclasses
import re

from .checks import check_framework_mode
from .frameworks import FRAMEWORKS, KINDS, load_driver, source_hash

__all__ = ["build_matrix", "matrix_markdown", "mode_entry", "normalised"]

_NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def normalised(value):
    """``value`` (the matrix's JSON data or Markdown text) with every decimal number rounded to 10
    significant digits: what ``refimpl matrix --check`` compares, so that the last digits of a
    framework's float64 result, which depend on the machine's vectorised kernels, are not drift."""
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.10g}")
    if isinstance(value, str):
        return _NUMBER.sub(lambda m: f"{float(m.group()):.10g}", value)
    return value


def _class_status(report) -> dict[str, str]:
    out = {}
    for c in report.by_class():
        if not c.ok:
            out[c.case_class] = "FAIL"
        elif c.departures:
            out[c.case_class] = "ok (" + ", ".join(c.departures) + ")"
        else:
            out[c.case_class] = "ok"
    return out


def mode_entry(driver, mode) -> dict:
    """One row group of the matrix: the mode under its profile and under the reference."""
    entry = {
        "kind": mode.kind,
        "mode": mode.name,
        "preset": mode.preset,
        "description": mode.description,
        "profile": dict(mode.convention),
        "framework_config": dict(mode.framework_config),
    }
    try:
        own = check_framework_mode(driver, mode, reference=False)
        reference = check_framework_mode(driver, mode, reference=True)
    except Exception as exc:  # a driver error is a row of the matrix, not a crash of the whole run
        entry["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        return entry
    entry["own"] = {"ok": own.ok, "classes": _class_status(own)}
    departures = []
    for c in reference.by_class():
        if c.ok:
            continue
        failing = [r for r in reference.results if r.case_class == c.case_class and not r.ok]
        smallest = min(failing, key=lambda r: (r.size, r.case_id))
        explanation = next((r.explanation for r in failing if r.explanation), None) or "unexplained"
        explanation = explanation.removeprefix("matches ")
        departures.append(
            {
                "case_class": c.case_class,
                "case_id": smallest.case_id,
                "explanation": explanation,
                "expected": smallest.expected,
                "got": smallest.got,
                "case": smallest.case_line,
            }
        )
    entry["reference"] = {"ok": reference.ok, "departures": departures}
    return entry


def build_matrix(frameworks: list[str] | tuple[str, ...] | None = None) -> dict:
    """The matrix as a JSON-ready dict (see the module docstring)."""
    names = tuple(frameworks) if frameworks else FRAMEWORKS
    unknown = [n for n in names if n not in FRAMEWORKS]
    if unknown:
        raise ValueError(f"--framework must be among {', '.join(FRAMEWORKS)}, got {', '.join(unknown)}")
    out = {"frameworks": []}
    for name in names:
        row: dict = {"framework": name, "available": False}
        try:
            driver = load_driver(name)
        except ImportError as exc:
            row["reason"] = f"no driver: {exc}"
            out["frameworks"].append(row)
            continue
        reason = driver.availability()
        row["pinned_version"] = driver.PINNED_VERSION
        if reason is not None:
            row["reason"] = f"not installed: {reason}"
            out["frameworks"].append(row)
            continue
        row.update(
            available=True,
            version=driver.installed_version(),
            source_hash=source_hash(driver.source_files()),
            modes=[],
            unsupported=[],
        )
        if driver.notes:
            row["notes"] = dict(driver.notes)
        for kind in KINDS:
            for mode in driver.modes(kind).values():
                row["modes"].append(mode_entry(driver, dataclasses.replace(mode, kind=kind)))
            for mode_name, why in driver.unsupported_modes(kind).items():
                row["unsupported"].append({"kind": kind, "mode": mode_name, "reason": why})
        out["frameworks"].append(row)
    return out


def _flags_text(flags: dict) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in flags.items()) or "(the spec)"


def matrix_markdown(matrix: dict) -> str:
    """The matrix as Markdown (docs/conformance-matrix.md)."""
    lines = [
        "# Conformance matrix",
        "",
        "Generated by `refimpl matrix` (do not edit). Each framework mode is checked under its own",
        "profile (flags applied to the reference implementation; must pass every case class) and under",
        "the reference convention, where each failing case class is a departure from the spec with the",
        "flag that reproduces the framework's value exactly, or `unexplained`.",
        "",
    ]
    for fw in matrix["frameworks"]:
        lines.append(f"## {fw['framework']}")
        lines.append("")
        if not fw["available"]:
            lines += [f"{fw['reason']} (profiles describe {fw.get('pinned_version', '?')}).", ""]
            continue
        warn = "" if fw["version"] == fw["pinned_version"] else f" (profiles describe {fw['pinned_version']})"
        lines += [f"Version {fw['version']}{warn}, source sha256 `{fw['source_hash']}`.", ""]
        lines += [
            "| kind | mode | profile flags | own profile | departures under the reference |",
            "| --- | --- | --- | --- | --- |",
        ]
        for m in fw["modes"]:
            if "error" in m:
                lines.append(
                    f"| {m['kind']} | `{m['mode']}` | {_flags_text(m['profile'])} | error | {m['error']} |"
                )
                continue
            own = m["own"]
            own_text = (
                "pass"
                if own["ok"]
                else "FAIL: " + ", ".join(k for k, v in own["classes"].items() if v == "FAIL")
            )
            allowed = sorted({v for v in own["classes"].values() if v.startswith("ok (")})
            if allowed:
                own_text += " " + " ".join(allowed).replace("ok (", "(")
            deps = "; ".join(f"`{d['case_class']}`: {d['explanation']}" for d in m["reference"]["departures"])
            flags = _flags_text(m["profile"])
            lines.append(f"| {m['kind']} | `{m['mode']}` | {flags} | {own_text} | {deps or 'none'} |")
        lines.append("")
        cases = [(m, d) for m in fw["modes"] if "reference" in m for d in m["reference"]["departures"]]
        if cases:
            lines += ["Minimal case of each departure (paste into Python after `import torch`):", ""]
            for m, d in cases:
                lines.append(f"- `{m['mode']}` / `{d['case_id']}` ({d['explanation']}): `{d['case']}`")
            lines.append("")
        if fw.get("notes"):
            lines += ["Notes (what the profile does not reproduce, or what the driver fixes):", ""]
            lines += [f"- {topic}: {text}" for topic, text in fw["notes"].items()]
            lines.append("")
        if fw["unsupported"]:
            lines += ["Unsupported modes:", ""]
            lines += [f"- {u['kind']} `{u['mode']}`: {u['reason']}" for u in fw["unsupported"]]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
