"""Issue 28 items 7 and 8. The vector consumers (specs/numpy_consumer.py and
tools/consumers/js/check_vectors.mjs) check every file against the schema before any vector runs:
a corrupted file is one line naming the file, the vector and the field, exit status 3, and the
other files are still checked; nothing corrupted passes. The numpy consumer's ``--skip-unsupported``
(issue 26) skips a vector whose function raises NotImplementedError, counted and listed. Scalar
arguments accept numpy scalars and 0-d tensors of a real dtype, never a bool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from refimpl._checks import as_int, as_real, check_discount
from refimpl.advantages import group_advantages
from refimpl.estimators import discounted_returns, n_step_returns
from specs import numpy_consumer as consumer

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "specs" / "vectors"
JS = ROOT / "tools" / "consumers" / "js" / "check_vectors.mjs"
EXAMPLE_KL = ROOT / "tools" / "consumers" / "example_kl.py"


def _kl(change) -> dict:
    document = json.loads((VECTORS / "kl.json").read_text())
    change(document)
    return document


CORRUPTIONS = {
    "no_result": (lambda d: d["vectors"][3].pop("result"), "vector kl/k1/3: result: null is not one of"),
    "no_inputs": (lambda d: d["vectors"][3].pop("inputs"), "vector kl/k1/3: inputs: missing"),
    "no_flags": (lambda d: d["vectors"][3].pop("flags"), "vector kl/k1/3: flags: missing"),
    "string_number": (lambda d: d["vectors"][3]["inputs"].__setitem__("logp", "abc"),
                      'vector kl/k1/3: inputs.logp: "abc" is not a number'),
    "vectors_object": (lambda d: d.__setitem__("vectors", {}), "vectors: missing or not a list"),
    "vectors_empty": (lambda d: d.__setitem__("vectors", []), "vectors: an empty list"),
    "result_maybe": (lambda d: d["vectors"][0].__setitem__("result", "maybe"),
                     'result: "maybe" is not one of'),
    "no_id": (lambda d: d["vectors"][0].pop("id"), "vector #0 (no id): id: missing"),
    "corrupt_expected": (lambda d: d["vectors"][0]["expected"].__setitem__("value", "0.1x"),
                         'vector kl/k1/0: expected.value: "0.1x" is not a number'),
    "repeated_id": (lambda d: d["vectors"][1].__setitem__("id", "kl/k1/0"), "kl/k1/0: id: repeated"),
}


@pytest.fixture
def vector_dir(tmp_path: Path) -> Path:
    for name in ("policy_loss.json", "returns.json", "kl.json"):
        shutil.copy(VECTORS / name, tmp_path / name)
    return tmp_path


def _numpy(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "specs" / "numpy_consumer.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupted_file_is_named_in_one_line_and_never_passes(name, tmp_path):
    change, words = CORRUPTIONS[name]
    path = tmp_path / "kl.json"
    path.write_text(json.dumps(_kl(change)))
    with pytest.raises(consumer.SchemaError) as info:
        consumer.load(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    assert "\n" not in str(info.value)
    report = consumer.check_directory(tmp_path, {"kl": lambda *a: (np.zeros(1), np.zeros(1))})
    assert not report.ok and report.checked == 0 and report.invalid_files == [str(info.value)]


def test_a_truncated_file_is_named(tmp_path):
    path = tmp_path / "kl.json"
    text = (VECTORS / "kl.json").read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(consumer.SchemaError, match=rf"^{path}: not valid JSON \("):
        consumer.load(path)


def test_the_command_line_checks_the_valid_files_and_exits_3(tmp_path):
    shutil.copy(VECTORS / "kl.json", tmp_path / "kl.json")
    (tmp_path / "zz.json").write_text(json.dumps(_kl(CORRUPTIONS["no_inputs"][0])))
    shutil.copy(EXAMPLE_KL, tmp_path / "example_kl.py")
    result = _numpy(str(tmp_path), "example_kl", cwd=tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "FAIL: 159 vectors checked, 0 skipped, 0 failed, 1 vector file invalid"
    bad = tmp_path / "zz.json"
    assert lines[1] == f"  invalid vector file: {bad}: vector kl/k1/3: inputs: missing or not an object"
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_skip_unsupported_counts_and_lists_the_skipped_vectors(tmp_path):
    (tmp_path / "partial.py").write_text(
        "import numpy as np\n"
        "def kl(estimator, logp, ref_logp):\n"
        "    if estimator != 'k1':\n"
        "        raise NotImplementedError(estimator)\n"
        "    if not (np.isfinite(logp).all() and np.isfinite(ref_logp).all()):\n"
        "        raise ValueError('not finite')\n"
        "    return -(ref_logp - logp), np.ones_like(logp)\n"
    )
    plain = _numpy(str(VECTORS / "kl.json"), "partial", cwd=tmp_path)
    skipping = _numpy(str(VECTORS / "kl.json"), "partial", "--skip-unsupported", cwd=tmp_path)
    assert plain.returncode == 1 and "raised NotImplementedError: k2" in plain.stdout
    k1 = sum(1 for v in json.loads((VECTORS / "kl.json").read_text())["vectors"] if v["estimator"] == "k1")
    assert skipping.returncode == 0, skipping.stdout + skipping.stderr
    first = skipping.stdout.splitlines()[0]
    assert first == f"PASS: {k1} vectors checked, 0 skipped, 0 failed, {159 - k1} unsupported (skipped)"
    assert "  unsupported: kl/k2/" in skipping.stdout
    # a stub that supports nothing checks nothing: never a pass
    (tmp_path / "stub.py").write_text("def kl(*args):\n    raise NotImplementedError\n")
    assert _numpy(str(VECTORS / "kl.json"), "stub", "--skip-unsupported", cwd=tmp_path).returncode == 2


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    return node


@pytest.mark.parametrize("name", ["no_result", "string_number", "vectors_empty", "result_maybe", "no_id",
                                  "corrupt_expected"])
def test_the_js_consumer_names_a_corrupted_file_and_checks_the_others(name, vector_dir):
    change, words = CORRUPTIONS[name]
    (vector_dir / "kl.json").write_text(json.dumps(_kl(change)))
    result = subprocess.run([_node(), str(JS), str(vector_dir)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("FAIL: 364 vectors checked")
    assert lines[0].endswith("0 failed, 1 vector file invalid")
    assert lines[1].startswith(f"  invalid vector file: {vector_dir / 'kl.json'}: ") and words.replace(
        "null is not", "undefined is not") in lines[1]


def test_the_js_consumer_names_a_truncated_file(vector_dir):
    text = (VECTORS / "kl.json").read_text()
    (vector_dir / "kl.json").write_text(text[: len(text) // 2])
    result = subprocess.run([_node(), str(JS), str(vector_dir)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 3 and f"{vector_dir / 'kl.json'}: not valid JSON (" in result.stdout


@pytest.mark.parametrize("value", [np.float32(0.5), np.float64(0.5), torch.tensor(0.5), torch.tensor(0.5,
                                   dtype=torch.float16), 0.5])
def test_a_discount_of_any_real_type_is_accepted(value):
    assert check_discount(value) == 0.5 and as_real(value) == 0.5
    rewards = torch.ones(1, 3, dtype=torch.float64)
    flags = torch.zeros(1, 3, dtype=torch.bool)
    returns = discounted_returns(rewards, flags, flags, value, torch.zeros(1, 3, dtype=torch.float64))
    assert returns.tolist() == [[1.75, 1.5, 1.0]]


@pytest.mark.parametrize(
    "value", [True, np.bool_(False), torch.tensor(True), torch.tensor([0.5]), "0.5", 0.5j]
)
def test_a_bool_or_a_non_scalar_is_refused_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"^gamma must be a real number, got "):
        check_discount(value)


def test_integer_arguments_take_numpy_and_tensor_integers_but_not_floats_or_bools():
    assert as_int(np.int64(2)) == 2 and as_int(torch.tensor(2)) == 2
    assert as_int(2.0) is None and as_int(True) is None and as_int(torch.tensor(2.0)) is None
    rewards = torch.ones(1, 3, dtype=torch.float64)
    flags = torch.zeros(1, 3, dtype=torch.bool)
    values = torch.zeros(1, 3, dtype=torch.float64)
    returns = n_step_returns(rewards, values, flags, flags, np.float32(0.5), np.int64(2))
    assert returns.tolist() == [[1.5, 1.5, 1.0]]
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        n_step_returns(rewards, values, flags, flags, 0.5, np.bool_(True))
    out = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), scale="group", singleton="zero",
                           std="sample", eps_inside_sqrt=False, zero_variance="zero", eps=np.float32(1e-6))
    assert out.shape == (2,)
