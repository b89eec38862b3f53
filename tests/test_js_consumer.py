"""The JavaScript consumer (tools/consumers/js/check_vectors.mjs, Node.js >= 20, no packages): its DAPO
loss and GAE pass every dapo policy-loss vector and every GAE vector, the planted bugs fail them,
and a file of another schema version is a clear error (exit 2). Marked ``node``: skipped where
Node.js is absent, a failure when RL_ORACLE_REQUIRE_NODE=1 (CI, tests/conftest.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "consumers" / "js" / "check_vectors.mjs"
VECTORS = ROOT / "specs" / "vectors"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(NODE is None, reason="node (Node.js >= 20) is not installed"),
]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def expected_count() -> int:
    policy = json.loads((VECTORS / "policy_loss.json").read_text())["vectors"]
    returns = json.loads((VECTORS / "returns.json").read_text())["vectors"]
    return sum(v["preset"] == "dapo" for v in policy) + sum(
        v["estimator"] == "gae_advantages" for v in returns
    )


def test_node_is_recent_enough():
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    assert int(version.lstrip("v").split(".")[0]) >= 20, version


def test_the_js_dapo_loss_and_gae_pass_every_vector():
    result = run(str(VECTORS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"PASS: {expected_count()} vectors checked"), result.stdout


def test_the_planted_bugs_fail_and_are_named_by_their_flags():
    result = run(str(VECTORS), "--plant-bug")
    assert result.returncode == 1, result.stdout + result.stderr
    failed = re.findall(r"^  (\S+) \[([^\]]*)\]", result.stdout, re.M)
    ids = {i for i, _ in failed}
    assert any(i.startswith("policy_loss/dapo/") for i in ids) and any(
        i.startswith("returns/gae") for i in ids
    )
    flags = {f for _, fl in failed for f in fl.split(", ")}
    assert {"ratio_above_upper_clip", "truncated_step"} <= flags


def test_another_schema_version_is_a_clear_error(tmp_path):
    for name in ("policy_loss.json", "returns.json"):
        document = json.loads((VECTORS / name).read_text())
        document["schema_version"] = 1
        (tmp_path / name).write_text(json.dumps(document))
    result = run(str(tmp_path))
    assert result.returncode == 2
    assert "unsupported schema_version 1 (this consumer reads version 2" in result.stderr
