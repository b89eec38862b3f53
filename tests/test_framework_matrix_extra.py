"""The committed docs/conformance-matrix-extra.md and .json against the installed `skyrl` package and
Unsloth (unsloth-zoo), in process: what ``refimpl matrix --framework skyrl_pkg --framework unsloth
--out docs/conformance-matrix-extra.md --json docs/conformance-matrix-extra.json --check`` (``make
check-frameworks``) checks; CI runs it in ``make test-matrix``. The extra matrix's Tunix rows need JAX:
``make check-frameworks-extra`` checks them."""

from __future__ import annotations

import pathlib

import pytest

from refimpl.conformance import matrix_check
from refimpl.conformance.cli import main
from refimpl.conformance.frameworks import load_driver

pytestmark = pytest.mark.framework

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTRA = ("skyrl_pkg", "unsloth")


def test_the_committed_extra_matrix_is_the_installed_frameworks_matrix(real_matrix, monkeypatch, capsys):
    for name in EXTRA:
        driver = load_driver(name)
        if driver.availability() is not None:
            pytest.skip(f"{name} is not drivable here: {driver.availability()}")
        if driver.installed_version() != driver.PINNED_VERSION:
            pytest.skip(f"{name} {driver.installed_version()} installed, not {driver.PINNED_VERSION}")
    monkeypatch.chdir(ROOT)
    built = []  # `refimpl matrix` builds through the session's cache
    monkeypatch.setattr(matrix_check, "build_matrix",
                        lambda names=None: built.append(names) or real_matrix(tuple(names or ()) or None))
    argv = ["matrix", *(a for name in EXTRA for a in ("--framework", name)),
            "--out", "docs/conformance-matrix-extra.md", "--json", "docs/conformance-matrix-extra.json",
            "--check"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0 and built == [list(EXTRA)], out[-3000:] + err
