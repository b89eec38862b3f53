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

The data (``build_matrix``; docs/conformance-matrix.json) holds every framework's modes and a
``summary``: per framework the counts (modes, passing under their profile, departing from the spec,
unexplained, unsupported, bugs), per flag the number of modes of each framework whose departures it
explains, and the findings: what a driver lists in its optional ``FINDINGS`` (frameworks/findings.py:
each with its class, bug, value only, documented default or subgradient at a kink, its verified line,
the releases affected, where it is fixed and the upstream thread; key: a flag, ``flag=value`` as the
matrix writes it, or a case class) with the modes that show them. ``matrix_markdown`` renders it
(docs/conformance-matrix.md): the summary on one screen, then one section per framework, every line
at most ``LINE_WIDTH`` characters (each departure's pasteable minimal case stays in the JSON).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

from .checks import check_framework_mode
from .conventions import FLAGS
from .frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, KINDS, load_driver, source_hash
from .frameworks.findings import FINDING_KINDS
from .kinds import KIND_FLAGS, KIND_REGISTRY

__all__ = ["LINE_WIDTH", "build_matrix", "matrix_markdown", "matrix_summary", "mode_entry", "normalised"]

#: the longest line ``matrix_markdown`` writes
LINE_WIDTH = 120

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
                "dtype": smallest.dtype,
                "case": smallest.case_line,
            }
        )
    # classes that pass the reference only with a note (e.g. a subgradient at the dual-clip tie)
    notes = sorted({f"{c.case_class}: {d}" for c in reference.by_class() if c.ok for d in c.departures})
    entry["reference"] = {"ok": reference.ok, "departures": departures, **({"notes": notes} if notes else {})}
    return entry


def build_matrix(frameworks: list[str] | tuple[str, ...] | None = None) -> dict:
    """The matrix as a JSON-ready dict (see the module docstring)."""
    names = tuple(frameworks) if frameworks else FRAMEWORKS
    unknown = [n for n in names if n not in FRAMEWORKS + EXTRA_FRAMEWORKS]
    if unknown:
        raise ValueError(f"--framework must be among {', '.join(FRAMEWORKS + EXTRA_FRAMEWORKS)}, "
                         f"got {', '.join(unknown)}")
    names = tuple(n for n in FRAMEWORKS + EXTRA_FRAMEWORKS if n in names)  # one order, whatever was asked
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
        findings = driver.findings()
        if findings:
            row["findings"] = [f.to_dict() for f in findings]
        for kind in KINDS:
            for mode in driver.modes(kind).values():
                row["modes"].append(mode_entry(driver, dataclasses.replace(mode, kind=kind)))
            for mode_name, why in driver.unsupported_modes(kind).items():
                row["unsupported"].append({"kind": kind, "mode": mode_name, "reason": why})
        out["frameworks"].append(row)
    out["summary"] = matrix_summary(out)
    return out


# ------------------------------------------------------------------------------------------------
# the summary: counts per framework, departures by flag, findings


def departure_flags(departure: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flag names, ``flag=value`` texts) of a departure's explanation ("flag a='x'" or "flags a=1,
    b=2"); ``(("unexplained",), ())`` when no flag reproduces it."""
    why = departure["explanation"]
    if not why.startswith(("flag ", "flags ")):
        return ("unexplained",) if why == "unexplained" else ("other: " + why,), ()
    assignments = tuple(a.strip() for a in re.split(r",\s*(?=\w+=)", why.split(" ", 1)[1]))
    assignments = tuple(a for a in assignments if not a.startswith("name="))  # the profile's name: no flag
    return tuple(a.split("=", 1)[0] for a in assignments), assignments


def _shows(key: str, departure: dict, kind: str = "bug") -> bool:
    """A finding keyed by a flag shows on a departure whose smallest explaining set of flags holds it;
    a *bug* only where its flag alone reproduces the departure (a candidate bug is never tagged on one
    that other flags are needed for); another class also on its own case class (verl's dual-clip tie
    departs by the dual clip the preset lacks). A key that is no flag names the departing case class."""
    names, assignments = departure_flags(departure)
    if key.split("=", 1)[0] in FLAGS + KIND_FLAGS:  # a flag (ratio_overflow is a class too: the flag decides)
        if kind == "bug":
            return (key,) == names or (key,) == assignments
        return key in names or key in assignments or key == departure["case_class"]
    return key == departure["case_class"]


def _noted(key: str, entry: dict) -> bool:
    """A finding keyed by a case class shows on a mode whose class passes the reference with a note."""
    return any(note.split(":", 1)[0] == key for note in entry["reference"].get("notes", []))


def matrix_summary(matrix: dict) -> dict:
    """The summary of ``matrix["frameworks"]`` (see the module docstring), as JSON-ready data."""
    rows, by_flag, by_kind, bugs = [], {}, {}, []
    for fw in matrix["frameworks"]:
        name = fw["framework"]
        if not fw["available"]:
            rows.append({"framework": name, "available": False})
            continue
        checked = [m for m in fw["modes"] if "error" not in m]
        departing = [m for m in checked if m["reference"]["departures"]]
        for m in departing:
            for flag in sorted({f for d in m["reference"]["departures"] for f in departure_flags(d)[0]}):
                by_flag.setdefault(flag, {}).setdefault(name, 0)
                by_flag[flag][name] += 1
            if m["kind"] in KIND_REGISTRY:  # the registry's kinds: one summary row per kind
                by_kind.setdefault(m["kind"], {}).setdefault(name, 0)
                by_kind[m["kind"]][name] += 1
        shown = []
        for finding in fw.get("findings", []):
            # a non-bug finding keyed by a flag also shows on the modes whose profile sets that flag
            # (verl's tie: the reference has no dual clip, so no departure shows it there)
            profiled = finding["kind"] != "bug" and finding["key"] in FLAGS + KIND_FLAGS
            modes = [m["mode"] for m in checked
                     if any(_shows(finding["key"], d, finding["kind"]) for d in m["reference"]["departures"])
                     or _noted(finding["key"], m) or (profiled and finding["key"] in m.get("profile", {}))]
            bugs.append({"framework": name, **finding, "modes": modes})
            shown += [finding["key"]] if modes and finding["kind"] == "bug" else []
        rows.append({
            "framework": name,
            "available": True,
            "version": fw["version"],
            "modes": len(fw["modes"]),
            "pass": sum(1 for m in checked if m["own"]["ok"]),
            "errors": len(fw["modes"]) - len(checked),
            "departing": len(departing),
            "unexplained": sum(1 for m in departing if any(
                d["explanation"] == "unexplained" for d in m["reference"]["departures"])),
            "unsupported": len(fw["unsupported"]),
            "bugs": len(shown),
        })
    summary = {"frameworks": rows, "departures_by_flag": dict(sorted(by_flag.items())), "findings": bugs}
    if by_kind:  # only where a registry kind's mode departs (an extra matrix without them is unchanged)
        summary["departures_by_kind"] = {k: by_kind[k] for k in KIND_REGISTRY if k in by_kind}
    return summary


# ------------------------------------------------------------------------------------------------
# Markdown


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    """``text`` as lines of at most ``LINE_WIDTH`` characters (words are never split)."""
    return textwrap.wrap(
        " ".join(text.split()), LINE_WIDTH, initial_indent=indent if first is None else first,
        subsequent_indent=indent, break_long_words=False, break_on_hyphens=False,
    ) or [first or indent]


def _item(text: str, depth: int = 0) -> list[str]:
    """A Markdown list item, wrapped (continuation lines indented under its text)."""
    pad = "  " * depth
    return _wrap(text, pad + "  ", pad + "- ")


def _number(x) -> str:
    return "n/a" if x is None else (f"{x:.10g}" if isinstance(x, float) else str(x))


def _flag_list(flags: dict) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in flags.items())


def _summary_lines(summary: dict) -> list[str]:
    names = [r["framework"] for r in summary["frameworks"]]
    lines = [
        "## Summary",
        "",
        "| framework | version | modes | pass | departing | unexplained | errors | unsupported "
        "| bugs |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["frameworks"]:
        link = f"[{r['framework']}](#{r['framework']})"
        if not r["available"]:
            lines.append(f"| {link} | not installed | | | | | | | |")
            continue
        cells = (r["modes"], r["pass"], r["departing"], r["unexplained"], r["errors"], r["unsupported"],
                 r["bugs"])
        lines.append(f"| {link} | {r['version']} | " + " | ".join(map(str, cells)) + " |")
    lines += [
        "",
        *_wrap("*modes*: in scope; *pass*: under the mode's own profile; *departing*: with at least one "
               "case class that differs from the spec (a departure under the reference); *unexplained*: "
               "with a departure no flag of its profile reproduces."),
        "",
    ]
    registry_flags = {f.name for kind in KIND_REGISTRY.values() for f in dataclasses.fields(kind.flags)}
    if summary["departures_by_flag"]:
        registry_note = (" (the registry's kinds: the modes of the kind that depart, each flag in the "
                         "framework's section)") if summary.get("departures_by_kind") else ""
        lines += _wrap("Departures under the reference by flag: the number of modes of each framework with a "
                       f"departure the flag reproduces{registry_note}.")
        lines += [
            "",
            "| flag | " + " | ".join(names) + " |",
            "| --- |" + " ---: |" * len(names),
        ]
        for flag, counts in summary["departures_by_flag"].items():
            if flag in registry_flags:
                continue
            label = flag if flag.startswith("other: ") else f"`{flag}`"
            lines.append(f"| {label} | " + " | ".join(str(counts.get(n, "")) for n in names) + " |")
        for kind, counts in summary.get("departures_by_kind", {}).items():
            cells = " | ".join(str(counts.get(n, "")) for n in names)
            lines.append(f"| kind `{kind}` | {cells} |")
        lines.append("")
    findings = summary["findings"]
    lines += _wrap("Findings: what the drivers found in the frameworks' code (`FINDINGS`; each in full in "
                   "its framework's section), by class: "
                   + "; ".join(f"*{k}*: {v}" for k, v in FINDING_KINDS.items())
                   + (":" if findings else ": none listed."))
    lines.append("")
    for f in findings:
        lines += _item(_finding_head(f))
    return lines + ([""] if findings else [])


def _finding_head(f: dict) -> str:
    """A finding in one item: framework, key, class, the modes showing it, line, fix, upstream."""
    count = len(f["modes"])
    shown = f"{count} mode{'s' if count > 1 else ''}" if count else "no mode departs by it here"
    if f["kind"] == "validation":
        shown = "its script shows it"
    facts = [f"`{f['where']}`" if f.get("where") else "",
             f"fixed in {f['fixed_in']}" if f.get("fixed_in") else "",
             f"upstream: {f['upstream']}" if f.get("upstream") else ""]
    facts_text = "; ".join(x for x in facts if x)
    head = f"{f['framework']} `{f['key']}`, **{f['kind']}** ({shown})"
    return head + (f": {facts_text}" if facts_text else "")


def _finding_lines(fw: dict, summary_findings: list[dict]) -> list[str]:
    """The framework section's findings, each in full."""
    rows = [f for f in summary_findings if f["framework"] == fw["framework"]]
    if not rows:
        return []
    lines = ["Findings (the summary gives each one's line, fix and upstream thread):", ""]
    for f in rows:
        lines += _item(f"`{f['key']}`, **{f['kind']}**: {f['text']}"
                       + (f" Affected: {f['affected']}." if f.get("affected") else ""))
    return lines + [""]


def _mode_lines(m: dict, common: dict, findings: list[dict]) -> list[str]:
    lines = [f"### {m['kind']} `{m['mode']}`", ""]
    if m.get("description"):
        lines += _wrap(m["description"]) + [""]
    own_flags = {k: v for k, v in m["profile"].items() if common.get(k, object()) != v}
    profile = "the framework's flags" if common else "(the spec)"
    if own_flags:
        profile = (profile + ", and " if common else "") + _flag_list(own_flags)
    lines += _item(f"profile: {profile}")
    if "error" in m:
        return lines + _item(f"error: {m['error']}") + [""]
    own = m["own"]
    failing = [k for k, v in own["classes"].items() if v == "FAIL"]
    verdict = "pass" if own["ok"] else "FAIL: " + ", ".join(failing)
    allowed = sorted({v.removeprefix("ok (").removesuffix(")") for v in own["classes"].values()
                      if v.startswith("ok (")})
    lines += _item(f"own profile: {verdict}" + (f" (allowed: {'; '.join(allowed)})" if allowed else ""))
    departures = m["reference"]["departures"]
    lines += _item("departures under the reference:" + ("" if departures else " none"))
    for note in m["reference"].get("notes", []):
        lines += _item(f"`{note.split(':', 1)[0]}`: passes with a note:{note.split(':', 1)[1]}", 1)
    for d in departures:
        flagged = [f"`{f['key']}` ({f['kind']})" for f in findings if _shows(f["key"], d, f["kind"])]
        mark = f"; finding {', '.join(flagged)}" if flagged else ""
        lines += _item(f"`{d['case_class']}`: {d['explanation']} (case `{d['case_id']}`: expected "
                       f"{_number(d['expected'])}, got {_number(d['got'])}{mark})", 1)
    return lines + [""]


def _framework_lines(fw: dict, summary_findings: list[dict]) -> list[str]:
    lines = [f"## {fw['framework']}", ""]
    if not fw["available"]:
        return lines + _wrap(f"{fw['reason']} (profiles describe {fw.get('pinned_version', '?')}).") + [""]
    warn = "" if fw["version"] == fw["pinned_version"] else f" (profiles describe {fw['pinned_version']})"
    lines += _wrap(f"Version {fw['version']}{warn}, source sha256 `{fw['source_hash']}`; {len(fw['modes'])} "
                   f"modes in scope, {len(fw['unsupported'])} unsupported.") + [""]
    # the flags every mode of the older kinds shares (a registry kind's mode has flags of its own kind)
    profiles = [m["profile"] for m in fw["modes"] if m["kind"] not in KIND_REGISTRY]
    common = {k: v for k, v in profiles[0].items() if all(p.get(k, object()) == v for p in profiles)} \
        if len(profiles) > 1 else {}
    if common:
        but = " but the registry kinds'" if len(profiles) < len(fw["modes"]) else ""
        which = "every mode's profile" + but
        lines += _wrap(f"The framework's flags (in {which}): {_flag_list(common)}.") + [""]
    for m in fw["modes"]:
        lines += _mode_lines(m, {} if m["kind"] in KIND_REGISTRY else common, fw.get("findings", []))
    lines += _finding_lines(fw, summary_findings)
    if fw.get("notes"):
        lines += ["Notes (what the profile does not reproduce, or what the driver fixes):", ""]
        for topic, text in fw["notes"].items():
            lines += _item(f"{topic}: {text}")
        lines.append("")
    if fw["unsupported"]:
        lines += ["Unsupported modes:", ""]
        for u in fw["unsupported"]:
            lines += _item(f"{u['kind']} `{u['mode']}`: {u['reason']}")
        lines.append("")
    return lines


def matrix_markdown(matrix: dict) -> str:
    """The matrix as Markdown (docs/conformance-matrix.md): the summary, then a section per framework;
    no line longer than ``LINE_WIDTH``."""
    lines = ["# Conformance matrix", ""]
    lines += _wrap(
        "Generated by `refimpl matrix` (do not edit; lines at most 120 characters). Each mode of each "
        "framework is checked under its own profile (flags applied to the reference implementation; it "
        "must pass every case class) and under the reference convention, where each failing case class "
        "is a departure from the spec, named by the flags of the mode's profile that reproduce the "
        "framework's value exactly, or `unexplained`. The same data, with each departure's minimal case as "
        "one line of Python, is in [conformance-matrix.json](conformance-matrix.json); `refimpl check "
        "--framework F --mode M --convention reference` prints those cases in full."
    )
    lines.append("")
    summary = matrix.get("summary") or matrix_summary(matrix)
    lines += _summary_lines(summary)
    for fw in matrix["frameworks"]:
        lines += _framework_lines(fw, summary["findings"])
    return "\n".join(lines).rstrip() + "\n"
