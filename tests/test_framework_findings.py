"""The drivers' findings (refimpl/conformance/frameworks/findings.py) are upstream-grade: each has a
class, every bug names the line it sits on and the releases affected, no tie of ``torch.max`` /
``torch.min`` at a kink is called a bug, and every cited line holds the quoted code in the installed
framework (the line numbers of the matrix are checked, not remembered)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, PACKAGES, load_driver
from refimpl.conformance.frameworks.findings import FINDING_KINDS, REPRODUCED_KINDS, Finding, as_findings
from refimpl.conformance.frameworks.install import opt_in
from refimpl.conformance.frameworks.repro import ARRAYS, BODIES, repro_script, write_repros


def test_every_framework_has_its_package_named_here():
    assert set(PACKAGES) == set(FRAMEWORKS + EXTRA_FRAMEWORKS)


@pytest.mark.parametrize("name", FRAMEWORKS + EXTRA_FRAMEWORKS)
def test_findings_are_classified_and_bugs_are_located(name):
    driver = load_driver(name)
    for finding in driver.findings():
        assert finding.kind in FINDING_KINDS and finding.text.strip(), finding
        if finding.kind == "bug":
            assert finding.where and finding.affected, f"{name} {finding.key}: a bug names its line, releases"
        if finding.key == "dual_clip_tie":
            assert finding.kind == "subgradient", f"{name}: a tie at the dual clip's kink is not a bug"
        if finding.kind == "validation":
            assert finding.key.startswith("config:") and finding.where, finding
        if finding.fixed_in or finding.upstream:
            assert finding.kind not in ("subgradient", "autodiff_tie"), finding


def test_a_finding_refuses_an_unknown_class_and_an_unchecked_line():
    with pytest.raises(ValueError, match="Finding.kind: expected one of"):
        Finding("k", "candidate", "t")
    with pytest.raises(ValueError, match="where and quote go together"):
        Finding("k", "bug", "t", where="loss.py:3")
    legacy = type("Module", (), {"CANDIDATE_BUGS": {"empty_step": "0 / 0"}})
    assert as_findings(legacy) == (Finding("empty_step", "bug", "0 / 0"),)


# CI installs every framework but the opt-in ones (an extra of their own: Tunix's JAX), so only their
# tests may skip there
_DRIVEN_IN_CI = [n if opt_in(n) else pytest.param(n, marks=pytest.mark.framework)
                 for n in FRAMEWORKS + EXTRA_FRAMEWORKS]


@pytest.mark.parametrize("name", _DRIVEN_IN_CI)
def test_every_cited_line_holds_the_quoted_code(name):
    driver = load_driver(name)
    if driver.availability() is not None:
        pytest.skip(f"{name} is not drivable here: {driver.availability()}")
    if driver.installed_version() != driver.pinned_version:
        pytest.skip(f"{name} {driver.installed_version()} installed: findings cite {driver.pinned_version}")
    spec = importlib.util.find_spec(PACKAGES[name])
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    for finding in driver.findings():
        if not finding.where:
            continue
        path, line = finding.where.rsplit(":", 1)
        lines = (root / path).read_text().splitlines()
        assert finding.quote in lines[int(line) - 1], (
            f"{name} {finding.key}: {finding.where} reads {lines[int(line) - 1].strip()!r}, "
            f"not {finding.quote!r}")
        if finding.function:
            got = enclosing_function(lines, int(line) - 1)
            assert got == finding.function, f"{name} {finding.key}: {finding.where} is in {got}()"
        # the same code in two functions: only the function's name tells the cited line from the other
        functions = {enclosing_function(lines, i) for i, text in enumerate(lines) if finding.quote in text}
        if len(functions) > 1 and (name, finding.key) not in _FUNCTION_UNNAMED:
            assert finding.function, (f"{name} {finding.key}: {finding.quote!r} occurs in "
                                      f"{sorted(functions)}: name the function (Finding.function)")


#: findings whose quote occurs in more than one function of the file but that do not name theirs yet
#: (listed so that the gap is seen and this line changes with it)
_FUNCTION_UNNAMED = {("skyrl", "kl_gradient"), ("skyrl", "zero_rows"), ("areal", "behavior_weight")}


def enclosing_function(lines: list[str], index: int) -> str | None:
    """The name of the innermost ``def`` around ``lines[index]`` (the nearest one above, indented less)."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for text in reversed(lines[:index]):
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")) and len(text) - len(stripped) < indent:
            return stripped.removeprefix("async ").removeprefix("def ").partition("(")[0]
    return None


def test_the_enclosing_function_is_the_innermost_def_above():
    lines = ["def outer(x):", "    def gate(t):", "        return t", "    y = gate(x)", "    return y"]
    assert [enclosing_function(lines, i) for i in (2, 3)] == ["gate", "outer"]
    assert enclosing_function(["x = 1"], 0) is None
    with pytest.raises(ValueError, match="function names the def"):
        Finding("k", "bug", "t", function="f")
    assert "function" not in Finding("k", "bug", "t").to_dict()


def test_every_bug_has_a_standalone_reproduction_and_every_reproduction_a_bug():
    bugs = {(name, f.key) for name in FRAMEWORKS + EXTRA_FRAMEWORKS for f in load_driver(name).findings()
            if f.kind in REPRODUCED_KINDS}
    assert bugs == set(BODIES)  # every one scripted, the opt-in framework's (Tunix: JAX) too
    for name, key in sorted(bugs):
        script = repro_script(name, key)
        compile(script, f"repro_{name}_{key}.py", "exec")
        imports = {line.split()[1].split(".")[0] for line in script.splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        arrays = {"jax", "numpy", "flax"} if name in ARRAYS else {"torch"}  # a JAX framework: no torch
        assert imports <= {"importlib", "pathlib", "sys", "types", "omegaconf", "verl", "trl",
                           "warnings", "collections", "dataclasses", "os", "tempfile", "math", *arrays,
                           "ast", "numpy", "typing",  # a def parsed from its file (AReaL, Tunix)
                           "itertools",  # the namespace of OpenRLHF's compute_advantages_and_returns
                           "asyncio"}, imports  # OpenRLHF's agent executors (utils/agent.py) are coroutines
        assert arrays - {"flax"} <= imports
        assert "refimpl" not in script


def test_repro_writes_one_script_per_bug_and_never_replaces_a_file(tmp_path, capsys):
    from refimpl.conformance.cli import main

    assert main(["check", "framework", "skyrl", "--repro", str(tmp_path / "r")]) == 0
    written = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert written == ["repro_skyrl_cispo_clip_low.py", "repro_skyrl_config_clip_ratio_c.py",
                       "repro_skyrl_config_max_seq_len.py", "repro_skyrl_kl_gradient.py",
                       "repro_skyrl_padding_values.py", "repro_skyrl_ratio_overflow.py",
                       "repro_skyrl_whiten_mean.py"]
    assert main(["check", "framework", "skyrl", "--repro", str(tmp_path / "r")]) == 2
    assert "exists; choose an empty directory" in capsys.readouterr().err
    assert main(["check", "framework", "trl", "--repro", str(tmp_path / "t")]) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        "repro_trl_a2po_all_incorrect.py",
        "repro_trl_async_grpo_normalizer.py", "repro_trl_async_grpo_ratio_overflow.py",
        "repro_trl_config_beta.py", "repro_trl_config_beta1.py",
        "repro_trl_config_delta.py", "repro_trl_config_entropy_coef.py",
        "repro_trl_config_entropy_coef_min.py", "repro_trl_config_epsilon.py",
        "repro_trl_config_epsilon_high.py", "repro_trl_config_loss_type.py",
        "repro_trl_config_multi_objective_aggregation.py", "repro_trl_config_off_policy_mask_threshold.py",
        "repro_trl_config_ref_model_mixup_alpha.py", "repro_trl_config_reward_clip_range.py",
        "repro_trl_config_sapo_temperature_neg.py", "repro_trl_config_top_entropy_quantile.py",
        "repro_trl_config_vespo_lambda_neg.py", "repro_trl_config_vllm_importance_sampling_clip_max.py",
        "repro_trl_constant_group_rounding.py", "repro_trl_empty_rows.py",
        "repro_trl_entropy_quantile_micro_batch.py",
        "repro_trl_generation_batch_normalizer.py", "repro_trl_gmpo_vllm_is.py",
        "repro_trl_kl_k3_overflow.py",
        "repro_trl_opsm_unscored_tokens.py", "repro_trl_ratio_overflow.py",
        "repro_trl_rloo_ratio_overflow.py", "repro_trl_sdpo_dapo_normalizer.py",
        "repro_trl_sdpo_scale_none.py", "repro_trl_sdpo_unscorable_rewards.py"]
    assert main(["check", "framework", "liger", "--repro", str(tmp_path / "l")]) == 0  # validation too
    assert "repro_liger_config_delta.py" in {p.name for p in (tmp_path / "l").iterdir()}
    assert main(["check", "framework", "tunix", "--repro", str(tmp_path / "x")]) == 0  # an extra driver
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [
        "repro_tunix_completion_mask_pad_eos.py", "repro_tunix_config_beta.py",
        "repro_tunix_config_clip_range_value.py", "repro_tunix_config_dynamic_sampling.py",
        "repro_tunix_config_entropy_coef.py",
        "repro_tunix_config_epsilon.py", "repro_tunix_config_epsilon_c.py",
        "repro_tunix_config_epsilon_low.py", "repro_tunix_config_gae_lambda.py",
        "repro_tunix_config_kl_clamp_value.py", "repro_tunix_config_max_seq_token_per_tpu.py",
        "repro_tunix_config_num_generations.py", "repro_tunix_config_overlong_buffer.py",
        "repro_tunix_config_sampler_is.py", "repro_tunix_config_sampler_is_threshold.py",
        "repro_tunix_config_top_p.py",
        "repro_tunix_entropy_neg_inf.py", "repro_tunix_old_logps_temperature.py",
        "repro_tunix_overlong_characters.py",
        "repro_tunix_overlong_floor.py", "repro_tunix_packed_rows.py", "repro_tunix_ppo_logps_temperature.py",
        "repro_tunix_ppo_rewards_int32.py", "repro_tunix_ratio_overflow.py",
        "repro_tunix_reward_nan_as_zero.py", "repro_tunix_rollout_logps_truncation.py",
        "repro_tunix_stale_old_logps.py",
        "repro_tunix_vanilla_drops_eos.py", "repro_tunix_whiten_sample_single.py"]
    assert main(["check", "framework", "openrlhf", "--repro", str(tmp_path / "o")]) == 0
    assert "repro_openrlhf_value_empty_step.py" in {p.name for p in (tmp_path / "o").iterdir()}


#: A fork server for the reproduction scripts: a fresh interpreter, started outside the checkout without
#: PYTHONPATH, imports torch once (most of a script's time), with torch._dynamo (Liger-Kernel's, TRL's and
#: verl's modules import it) and, where installed, transformers' model classes (TRL's and verl's modules
#: import them: 1-2 s a script), and forks one child per script, which runs
#: it as ``python script.py`` would (``__main__``, its folder first on sys.path, its own stdout and
#: stderr, a 300 s alarm) and exits; the server answers each script's exit status on a line.
SCRIPT_SERVER = r"""
import os, runpy, signal, sys, traceback
import importlib.util
import torch  # noqa: F401  (shared by every script; a JAX framework's script never touches it)
import torch._dynamo  # noqa: F401
if importlib.util.find_spec("transformers") is not None:
    import transformers.modeling_utils, transformers.models.auto.auto_factory  # noqa: F401
for line in iter(sys.stdin.readline, ""):
    script = line.rstrip("\n")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, suffix in ((1, ".stdout"), (2, ".stderr")):
                os.dup2(os.open(script + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            os.chdir(os.path.dirname(script))
            sys.argv, sys.path[0] = [script], os.path.dirname(script)
            signal.alarm(300)
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def run_script(tmp_path_factory):
    """``run_script(path)``: the script's (returncode, stdout, stderr) from ``SCRIPT_SERVER``, started on
    first use (a module whose scripts all skip starts nothing)."""
    server = []

    def run(script: pathlib.Path) -> subprocess.CompletedProcess:
        if not server:
            server.append(subprocess.Popen(
                [sys.executable, "-c", SCRIPT_SERVER], cwd=tmp_path_factory.mktemp("scripts"), text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}))
        proc = server[0]
        proc.stdin.write(f"{script.resolve()}\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        assert answer, "the script server stopped"
        out, err = (pathlib.Path(f"{script.resolve()}.{part}").read_text() for part in ("stdout", "stderr"))
        return subprocess.CompletedProcess([str(script)], int(answer), out, err)

    yield run
    for proc in server:
        proc.stdin.close()
        proc.wait(timeout=60)


_REPRODUCTIONS = [(n, k) if opt_in(n) else pytest.param(n, k, marks=pytest.mark.framework)
                  for n, k in sorted(BODIES)]


@pytest.mark.parametrize("name, key", _REPRODUCTIONS)
def test_every_reproduction_reproduces_against_the_installed_framework(name, key, tmp_path, run_script):
    """CI: each bug's standalone script, run by the interpreter alone outside the checkout (a child of
    ``SCRIPT_SERVER``), prints the framework's value next to the exact one and exits 0 (reproduced).
    An opt-in framework's (Tunix: JAX, which CI does not install) skips where it is not installed;
    ``make check-frameworks-extra`` runs it."""
    driver = load_driver(name)
    if driver.availability() is not None:
        pytest.skip(f"{name} is not drivable here: {driver.availability()}")
    wanted = f"repro_{name}_{key.replace(':', '_')}.py"
    (script,) = [p for p in write_repros(name, tmp_path) if p.name == wanted]
    done = run_script(script)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("REPRODUCED"), done.stdout + done.stderr
    assert "  framework: " in done.stdout and "  exact:     " in done.stdout
