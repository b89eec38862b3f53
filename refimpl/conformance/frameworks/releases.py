"""Releases of a framework other than the pinned one: where and how each is installed
(``install_release``), and the profile a driver gives each.

A release is installed into a directory of its own (``release_dir``: ``pip install --no-deps
--target``, ``refimpl frameworks install NAME --version X``) and driven by the same driver in a
process whose ``PYTHONPATH`` starts with that directory (``release_env``), so that the driver finds
that release's files and ``importlib.metadata`` its version. Where a release computes differently
from the pinned one, its driver says so as data: ``RELEASE_FLAGS = {version: {mode: {flag: value}}}``
(``release_modes`` applies them to ``MODES`` for the installed release), and the kit checks that the
release passes under them, as the pinned release passes under its profile; docs/conformance-drift.md
lists them (``refimpl.conformance.frameworks.drift``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

from .driver import Mode, distribution_version

__all__ = [
    "RELEASES_DIR", "install_release", "release_command", "release_dir", "release_env", "release_modes",
]

#: where ``refimpl frameworks install NAME --version X`` puts release X (relative to the working
#: directory; git-ignored)
RELEASES_DIR = pathlib.Path(".frameworks-releases")


def release_dir(distribution: str, version: str, root: pathlib.Path | None = None) -> pathlib.Path:
    """The directory release ``version`` of ``distribution`` is installed into."""
    return (root or RELEASES_DIR) / f"{distribution}-{version}"


def release_env(directory: pathlib.Path, env: dict | None = None) -> dict:
    """``env`` (default: this process's) with ``directory`` first on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH")
    out["PYTHONPATH"] = str(pathlib.Path(directory).resolve()) + (os.pathsep + rest if rest else "")
    return out


def release_modes(modes: tuple[Mode, ...], release_flags: dict, distribution: str) -> tuple[Mode, ...]:
    """``modes`` with the installed release's flags (``release_flags[version][mode name]``) merged
    into each mode's profile; unchanged for a release ``release_flags`` does not name."""
    flags = release_flags.get(distribution_version(distribution) or "", {})
    unknown = set(flags) - {m.name for m in modes}
    if unknown:
        raise ValueError(f"RELEASE_FLAGS names modes that do not exist: {sorted(unknown)}")
    return tuple(
        dataclasses.replace(m, convention={**m.convention, **flags[m.name]}) if m.name in flags else m
        for m in modes
    )


def release_command(name: str, version: str, target: str, python: str = sys.executable) -> list[str]:
    """The pip command that installs release ``version`` of framework ``name`` alone into the
    directory ``target`` (``--no-deps --target``, with the driver's ``INSTALL_OPTIONS``): what the
    driver's loss code imports beyond it comes from the environment (``refimpl frameworks install``)."""
    from . import load_driver

    driver = load_driver(name)
    distribution = getattr(driver.module, "DISTRIBUTION", driver.name)
    options = list(getattr(driver.module, "INSTALL_OPTIONS", ()))
    return [python, "-m", "pip", "install", "-q", "--no-deps", *options, "--target", target,
            f"{distribution}=={version}"]


def install_release(name: str, version: str, target: str | None = None, *, quiet: bool = False) -> str:
    """Install release ``version`` of ``name`` into ``target`` (default ``releases.release_dir``) unless
    it is there already; returns the directory. RuntimeError (one line) when pip fails."""
    from . import load_driver

    driver = load_driver(name)
    distribution = getattr(driver.module, "DISTRIBUTION", driver.name)
    directory = target or str(release_dir(distribution, version))
    marker = f"{directory}/.installed"
    if os.path.exists(marker):
        return directory
    command = release_command(name, version, directory)
    if not quiet:
        print("$ " + " ".join(["python", *command[1:]]), flush=True)
    if subprocess.call(command) != 0:
        raise RuntimeError(f"pip could not install {distribution}=={version} into {directory} (above)")
    with open(marker, "w") as handle:
        handle.write(f"{distribution}=={version}\n")
    return directory
