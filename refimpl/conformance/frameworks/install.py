"""``refimpl frameworks install`` and ``refimpl frameworks list``: the real frameworks at the releases the
drivers' profiles describe, installed as the drivers need them, from a checkout or from the wheel.

The frameworks' own dependency pins cannot all hold at once (OpenRLHF pins deepspeed and flash-attn,
CUDA source builds; SkyRL-train declares Python 3.12 only; verl and TRL bound transformers
differently), so no single ``pip install`` takes them. The install is two steps, both under a
constraints file holding the environment's torch, numpy and sympy (so pip never swaps the CPU torch
for a multi-GB CUDA build):

1. the ``frameworks`` extra of rl-oracle (``pip install "rl-oracle[frameworks]"``: the packages the
   drivers share, transformers and accelerate), **with** their dependencies;
2. per framework, ``DISTRIBUTION==PINNED_VERSION`` and the few packages its loss code imports
   (the driver's ``REQUIREMENTS``), **without** dependencies (``--no-deps``, plus the driver's
   ``INSTALL_OPTIONS``, e.g. SkyRL-train's ``--ignore-requires-python``). The import-only rest
   (ray, deepspeed, ...) is stubbed inside the drivers while the framework's modules import.

A driver whose framework needs a runtime of its own (Tunix: JAX) names an extra of rl-oracle as its
``EXTRA``: that extra is installed with its dependencies in step 1, and such a framework is installed
only when named (``refimpl frameworks install tunix``), so the default install stays without it.

Each driver is the one home of its pins: the framework's version is its ``PINNED_VERSION``, so a
profile and the release it describes cannot drift apart.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile

from ..cli_args import one_line_errors
from . import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver
from .releases import install_release, release_command, release_dir, release_env

__all__ = ["CONSTRAINED", "extra_requirements", "framework_requirements", "install_commands", "opt_in",
           "register"]

#: distributions whose installed versions every install step keeps (written to a constraints file)
CONSTRAINED = ("torch", "numpy", "sympy")

EXTRA = "frameworks"


def extra_requirements(extra: str = EXTRA) -> list[str]:
    """The requirements of rl-oracle's ``extra`` (from the installed distribution's metadata, the
    one home of them: pyproject.toml's ``[project.optional-dependencies]``)."""
    try:
        requires = importlib.metadata.requires("rl-oracle") or []
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - the package runs installed
        raise RuntimeError("rl-oracle is not installed: install it (pip install -e . or its wheel)") from None
    marker = re.compile(r""";\s*extra\s*==\s*["']""" + re.escape(extra) + r"""["']\s*$""")
    return [marker.split(r)[0].strip() for r in requires if marker.search(r)]


def framework_requirements(name: str) -> tuple[list[str], list[str]]:
    """(requirements, pip options) of framework ``name``'s ``--no-deps`` step: its pinned release and
    its driver's ``REQUIREMENTS``."""
    driver = load_driver(name)
    distribution = getattr(driver.module, "DISTRIBUTION", driver.name)
    pins = [f"{distribution}=={driver.pinned_version}", *getattr(driver.module, "REQUIREMENTS", ())]
    return pins, list(getattr(driver.module, "INSTALL_OPTIONS", ()))


def constraints() -> list[str]:
    """``name==version`` of each ``CONSTRAINED`` distribution installed here."""
    out = []
    for name in CONSTRAINED:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def install_commands(
    names: tuple[str, ...], constraints_file: str, python: str = sys.executable
) -> list[list[str]]:
    """The pip commands that install frameworks ``names``: the extra with dependencies, then one
    ``--no-deps`` command for every framework (options grouped: one command per distinct option set)."""
    pip = [python, "-m", "pip", "install", "-q", "-c", constraints_file]
    commands = [pip + extra_requirements()]
    for name in names:  # a runtime of the framework's own (Tunix's JAX), with its dependencies
        extra = getattr(load_driver(name).module, "EXTRA", None)
        if extra:
            commands.append(pip + extra_requirements(extra))
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in names:
        pins, options = framework_requirements(name)
        group = groups.setdefault(tuple(options), [])
        group.extend(p for p in pins if p not in group)  # skyrl-train and skyrl share their requirements
    for options, pins in groups.items():
        commands.append(pip + ["--no-deps", *options, *pins])
    return commands


def opt_in(name: str) -> bool:
    """Whether framework ``name`` is installed only when named: its driver needs an extra of its own
    (``EXTRA``: Tunix's JAX)."""
    return bool(getattr(load_driver(name).module, "EXTRA", None))


def _names(requested: list[str] | None, *, opt_ins: bool = False) -> tuple[str, ...]:
    """``requested``, checked, or by default every framework (those ``opt_in`` only with ``opt_ins``)."""
    everything = FRAMEWORKS + EXTRA_FRAMEWORKS
    names = tuple(requested or (n for n in everything if opt_ins or not opt_in(n)))
    unknown = [n for n in names if n not in everything]
    if unknown:
        raise ValueError(f"framework must be among {', '.join(everything)}, got {', '.join(unknown)}")
    return names


def run_install(args: argparse.Namespace) -> int:
    """``refimpl frameworks install [NAME ...] [--dry-run]``, or ``install NAME --version X
    [--target DIR]``: release X alone into its own directory."""
    try:
        names = _names(args.names)
        if getattr(args, "version", None) and len(names) != 1:
            raise ValueError("--version installs one framework's release: name exactly one framework")
    except ValueError as exc:
        print(f"refimpl frameworks install: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "version", None):
        if args.dry_run:
            driver = load_driver(names[0])
            target = args.target or str(release_dir(getattr(driver.module, "DISTRIBUTION", driver.name),
                                                    args.version))
            print("$ " + " ".join(["python", *release_command(names[0], args.version, target)[1:]]))
            return 0
        try:
            print(install_release(names[0], args.version, args.target))
        except RuntimeError as exc:
            print(f"refimpl frameworks install: {exc}", file=sys.stderr)
            return 1
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="rl-oracle-constraints-") as handle:
        handle.write("\n".join(constraints()) + "\n")
        handle.flush()
        commands = install_commands(names, handle.name)
        for command in commands:
            shown = ["python", *command[1:]] if command[0] == sys.executable else command
            print("$ " + " ".join(shown), flush=True)
            if args.dry_run:
                continue
            status = subprocess.call(command)
            if status != 0:
                print(f"refimpl frameworks install: pip exited {status} (above)", file=sys.stderr)
                return 1
    if not args.dry_run:
        return run_list(argparse.Namespace(names=list(names)))
    return 0


def run_list(args: argparse.Namespace) -> int:
    """``refimpl frameworks list``: each framework's pinned and installed release and whether its
    driver can run it (exit 0; the reason when it cannot)."""
    try:
        names = _names(args.names, opt_ins=True)
    except ValueError as exc:
        print(f"refimpl frameworks list: {exc}", file=sys.stderr)
        return 2
    for name in names:
        driver = load_driver(name)
        installed = driver.installed_version()
        reason = driver.availability()
        state = "ready" if reason is None else reason
        pinned = "" if installed in (None, driver.pinned_version) else \
            f" (profiles describe {driver.pinned_version})"
        print(f"{name:9} pinned {driver.pinned_version:8} installed {installed or '-':8}{pinned}  {state}")
    return 0


def run_check_release(args: argparse.Namespace) -> int:
    """``refimpl frameworks check NAME --version X [...]``: release X installed into its own directory
    (``install_release``) and ``refimpl check framework NAME`` run on it (the same driver, in a process
    whose ``PYTHONPATH`` starts with that directory); ``--mode`` / ``--preset`` / ``--kind`` / ``--json``
    go to ``check framework``."""
    try:
        (name,) = _names([args.name])
        directory = install_release(name, args.version, args.target)
    except (ValueError, RuntimeError) as exc:
        print(f"refimpl frameworks check: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    rest = [x for o in ("mode", "preset", "kind") if getattr(args, o) for x in (f"--{o}", getattr(args, o))]
    command = [sys.executable, "-m", "refimpl", "check", "framework", name, *rest,
               *(["--json"] if args.json else [])]
    return subprocess.call(command, env=release_env(directory))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``refimpl frameworks install|list`` (refimpl.cli provider protocol)."""
    parser = subparsers.add_parser(
        "frameworks",
        help="install the real frameworks at the releases the conformance profiles describe, or list them",
        description="Install the six real frameworks the conformance kit drives, at their pinned releases "
        "(the 'frameworks' extra with dependencies, each framework with --no-deps), or list them.",
    )
    one_line_errors(parser, "refimpl frameworks")
    sub = parser.add_subparsers(dest="frameworks_command", metavar="{install,list,check,drift}")
    sub.required = True
    install = sub.add_parser("install", help="pip-install the pinned releases into this environment")
    one_line_errors(install, "refimpl frameworks install")
    install.add_argument(
        "names", nargs="*", metavar="NAME",
        help="frameworks (default: all but those whose driver needs an extra of its own, such as tunix's JAX,"
        " installed only when named)"
    )
    install.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    install.add_argument("--version", help="install this release of the one NAME alone into its own "
                         "directory (pip --no-deps --target), for refimpl frameworks check NAME --version X")
    install.add_argument("--target", help="the directory of --version (default .frameworks-releases/DIST-X)")
    install.set_defaults(func=run_install)
    check = sub.add_parser("check", help="install a release into its own directory and check it",
                           description="refimpl frameworks check NAME --version X [check framework "
                           "options]: release X of NAME into its own directory, then `refimpl check "
                           "framework NAME` on it.")
    one_line_errors(check, "refimpl frameworks check")
    check.add_argument("name", metavar="NAME")
    check.add_argument("--version", required=True, help="the release to check, e.g. 0.9.0")
    check.add_argument("--target", help="its directory (default .frameworks-releases/DIST-X)")
    for option in ("--mode", "--preset", "--kind"):
        check.add_argument(option, help=f"passed to refimpl check framework {option}")
    check.add_argument("--json", action="store_true", help="passed to refimpl check framework")
    check.set_defaults(func=run_check_release)
    from .drift import register as register_drift

    register_drift(sub)
    listing = sub.add_parser("list", help="pinned and installed releases, and whether each driver can run")
    one_line_errors(listing, "refimpl frameworks list")
    listing.add_argument("names", nargs="*", metavar="NAME")
    listing.set_defaults(func=run_list)
