"""The JavaScript consumer (tools/consumers/js/check_vectors.mjs, Node.js >= 20, no packages): its
policy-loss family (every preset of policy_loss.json, dual clip and the k1 / k2 / k3 penalty
included), its KL estimators and its GAE pass every policy_loss, kl and gae_advantages vector; each
planted bug fails exactly the vectors that carry its edge; an invalid vector passes only on a
RangeError; ``--only`` selects and ``--help`` documents; a file of another schema version, an
unknown bug and a selector that selects nothing are clear errors (exit 2). Marked ``node``:
skipped where Node.js is absent, a failure when RL_ORACLE_REQUIRE_NODE=1 (CI, tests/conftest.py)."""

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


def load(name: str) -> list[dict]:
    return json.loads((VECTORS / name).read_text())["vectors"]


POLICY, KL = load("policy_loss.json"), load("kl.json")
GAE = [v for v in load("returns.json") if v["estimator"] == "gae_advantages"]


def expected_count() -> int:
    return len(POLICY) + len(KL) + len(GAE)


def failing(*bugs: str) -> list[tuple[str, set[str]]]:
    """(id, flags) of every failure of the consumer's ``run`` with the planted ``bugs`` (the module's
    own function, imported by node, so the list is not cut at the CLI's 20 lines)."""
    program = (
        f"import {{ run }} from {json.dumps(SCRIPT.as_uri())};"
        f"const r = run({json.dumps(str(VECTORS))}, {{ bugs: new Set({json.dumps(list(bugs))}) }});"
        "console.log(JSON.stringify(r));"
    )
    result = subprocess.run([NODE, "--input-type=module", "-e", program], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["checked"] == expected_count()
    rows = [re.match(r"(\S+) \[([^\]]*)\]", line).groups() for line in report["failures"]]
    return [(i, set(f.split(", ")) - {""}) for i, f in rows]


def test_node_is_recent_enough():
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    assert int(version.lstrip("v").split(".")[0]) >= 20, version


def test_the_js_policy_loss_kl_and_gae_pass_every_vector():
    result = run(str(VECTORS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"PASS: {expected_count()} vectors checked (policy loss, KL, GAE)"), (
        result.stdout
    )
    assert {v["preset"] for v in POLICY} == {
        "ppo", "grpo", "dr_grpo", "dapo", "bnpo", "gspo", "gspo_token", "sapo", "cispo",
        "dr_grpo+token_sum", "gspo+token_sum",
    }


def test_planted_bug_clip_higher_fails_the_presets_with_eps_high_above_eps_low():
    failures = failing("clip_higher")
    assert {i.split("/")[1] for i, _ in failures} == {"dapo", "cispo", "gspo", "gspo_token", "gspo+token_sum"}
    assert all(i.startswith("policy_loss/") for i, _ in failures)
    assert any("ratio_above_upper_clip" in f for _, f in failures)


def test_planted_bug_empty_rows_fails_only_sequence_means_with_an_empty_row():
    failures = failing("empty_rows")
    assert failures and all("empty_row" in f for _, f in failures)
    assert {i.split("/")[1] for i, _ in failures} <= {
        "grpo", "dr_grpo", "gspo", "gspo_token", "sapo", "dr_grpo+token_sum", "gspo+token_sum"
    }


def test_planted_bug_sapo_one_temperature_fails_sapo_only():
    failures = failing("sapo_one_tau")
    assert failures and {i.split("/")[1] for i, _ in failures} == {"sapo"}


def test_planted_bug_no_dual_clip_fails_exactly_the_dual_clip_active_vectors():
    failures = failing("no_dual_clip")
    expected = {f"policy_loss/{p}/dual_clip_active/0" for p in ("ppo", "grpo", "dapo")}
    assert {i for i, _ in failures} == expected
    assert all("dual_clip_active" in f for _, f in failures)


def test_planted_bug_naive_k3_fails_the_small_log_ratio_kl_vectors():
    failures = failing("naive_k3")
    assert failures and all(i.startswith("kl/k3/") for i, _ in failures)
    assert any("log_ratio_tiny" in f for _, f in failures)


def test_planted_bug_gae_truncation_fails_the_truncated_steps():
    result = run(str(VECTORS), "--plant-bug=gae_truncation")
    assert result.returncode == 1 and "(planted bugs: gae_truncation)" in result.stdout
    failures = failing("gae_truncation")
    assert failures
    assert all(i.startswith("returns/gae_advantages/") and "truncated_step" in f for i, f in failures)


def test_every_planted_bug_at_once_and_an_unknown_one():
    result = run(str(VECTORS), "--plant-bug")
    assert result.returncode == 1 and "planted bugs: clip_higher, empty_rows" in result.stdout
    result = run(str(VECTORS), "--plant-bug=clip_higher,no_such_bug")
    assert result.returncode == 2 and "unknown bug no_such_bug" in result.stderr


def test_another_schema_version_is_a_clear_error(tmp_path):
    for name in ("policy_loss.json", "kl.json", "returns.json"):
        document = json.loads((VECTORS / name).read_text())
        document["schema_version"] = 1
        (tmp_path / name).write_text(json.dumps(document))
    result = run(str(tmp_path))
    assert result.returncode == 3  # an invalid vector file (issue 28): its own exit status
    assert "unsupported schema_version 1 (this consumer reads version 2" in result.stdout


def test_help_documents_the_options_the_bugs_and_the_exit_status():
    result = run("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: node check_vectors.mjs")
    assert "--only=SELECTOR" in result.stdout and "throws RangeError" in result.stdout
    assert "exit status: 0 every checked vector passes, 1 one fails, 2 a usage error, 3 a vector file is" in (
        result.stdout)
    for bug in ("clip_higher", "empty_rows", "sapo_one_tau", "no_dual_clip", "naive_k3", "gae_truncation"):
        assert f"{bug}: " in result.stdout
    assert run("-h").stdout == result.stdout


@pytest.mark.parametrize(
    ("args", "selected"),
    [
        (("--only=kl/k3",), lambda v: v["id"].startswith("kl/k3/")),
        (("--only", "dapo"), lambda v: v.get("preset") == "dapo"),
        (("--only=gae_advantages,sapo",), lambda v: "gae_advantages" in v["id"] or v.get("preset") == "sapo"),
        (("--only=policy_loss/*/mixed/*",), lambda v: v in POLICY and "/mixed/" in v["id"]),
    ],
)
def test_only_selects_vectors(args, selected):
    want = sum(map(selected, POLICY + KL + GAE))
    result = run(str(VECTORS), *args)
    assert want and result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"PASS: {want} vectors checked (policy loss, KL, GAE), 0 failed")


def test_usage_mistakes_exit_2_with_one_line():
    for args, message in [
        (("--only=no_such_thing",), "error: --only no_such_thing selects no vector"),
        (("--only",), "error: --only needs a SELECTOR"),
        (("--verbose",), "error: unknown option --verbose"),
        ((str(VECTORS), "extra"), "error: one VECTOR_DIR expected, got 2"),
    ]:
        result = run(*args)
        assert result.returncode == 2 and result.stderr.startswith(message), (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


STUB_VECTORS = [v for v in POLICY if v["result"] == "invalid"][:10]
STUB_VECTORS += [v for v in POLICY if v["result"] == "valid"][:10]


def test_only_a_range_error_rejects_an_invalid_vector():
    """A stub that throws Error("not implemented") (or a TypeError from a missing field) fails the
    invalid vectors as well as the valid ones; one that throws RangeError passes only the invalid."""
    program = (
        f"import {{ checkVector }} from {json.dumps(SCRIPT.as_uri())};"
        f"const vectors = {json.dumps(STUB_VECTORS)};"
        "const out = {};"
        "for (const E of [Error, TypeError, RangeError]) {"
        "  const stub = () => { throw new E('stub'); };"
        "  out[E.name] = vectors.map((v) => [v.result, checkVector(v, stub, new Set())]);"
        "}"
        "console.log(JSON.stringify(out));"
    )
    result = subprocess.run([NODE, "--input-type=module", "-e", program], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    results = [r for r, _ in out["Error"]]
    assert "invalid" in results and "valid" in results
    for name in ("Error", "TypeError"):
        assert all(message is not None for _, message in out[name]), name
        invalid = [m for r, m in out[name] if r == "invalid"]
        assert all(m.startswith(f"threw {name}: stub, not RangeError (") for m in invalid), invalid
    assert all((message is None) == (r == "invalid") for r, message in out["RangeError"])


def test_the_readme_examples_print_what_it_shows():
    readme = (ROOT / "tools" / "consumers" / "js" / "README.md").read_text()
    block = readme.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    examples = [(line[2:], block[i + 1]) for i, line in enumerate(block) if line.startswith("$ ")]
    assert len(examples) == 2
    for command, first_line in examples:
        result = subprocess.run([NODE, *command.split()[1:]], capture_output=True, text=True, cwd=ROOT,
                                timeout=120)
        assert result.stdout.splitlines()[0] == first_line, command
