"""``refimpl check loss|kl|advantages|logprobs MODULE:FUNCTION`` end to end: a user's function in a
temporary module, run in-process through ``main()`` (one subprocess run checks the real entry point),
with the exit code, the printed table, the one-line errors and the earlier spellings checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from refimpl.conformance.cli import main

USER_MODULE = textwrap.dedent('''
    import torch

    NOT_CALLABLE = 3

    def dapo_loss(logp, old_logp, advantages, mask, *, normalizer=None):
        """A framework-style DAPO loss (token mean, eps_low 0.2, eps_high 0.28)."""
        dtype = torch.promote_types(logp.dtype, torch.float32)
        mask = mask.bool()
        ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0).clamp(max=80.0))
        a = advantages.to(dtype).unsqueeze(-1)
        per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a), 0.0)
        return per_token.sum() / (normalizer or mask.sum().clamp(min=1))

    def grpo_as_token_mean(logp, old_logp, advantages, mask, *, normalizer=None):
        """GRPO's clip (0.2 / 0.2) but DAPO's token mean: a wrong aggregation."""
        dtype = torch.promote_types(logp.dtype, torch.float32)
        mask = mask.bool()
        ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0).clamp(max=80.0))
        a = advantages.to(dtype).unsqueeze(-1)
        per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a), 0.0)
        return per_token.sum() / (normalizer or mask.sum().clamp(min=1))

    def seq_mean_token_sum(logp, old_logp, advantages, mask, *, normalizer=None):
        """verl's seq-mean-token-sum: token sums averaged over the non-empty sequences."""
        dtype = torch.promote_types(logp.dtype, torch.float32)
        mask = mask.bool()
        ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0).clamp(max=80.0))
        a = advantages.to(dtype).unsqueeze(-1)
        per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a), 0.0)
        rows = mask.any(-1).sum().clamp(min=1)
        return per_token.sum() / (normalizer or rows)

    def dapo_loss_swapped_bounds(logp, old_logp, advantages, mask, *, normalizer=None):
        dtype = torch.promote_types(logp.dtype, torch.float32)
        mask = mask.bool()
        ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0).clamp(max=80.0))
        a = advantages.to(dtype).unsqueeze(-1)
        per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.72, 1.2) * a), 0.0)
        return per_token.sum() / (normalizer or mask.sum().clamp(min=1))

    def wrong_signature(logp, old_logp):
        return (logp - old_logp).sum()

    def per_token_loss(logp, old_logp, advantages, mask, *, normalizer=None):
        return torch.exp(logp - old_logp) * mask

    def loss_with_other_signature(old_log_prob, log_prob, advantages, response_mask, eps_low, eps_high,
                                  global_tokens):
        """verl-like argument order, config and the global token count (verl's global batch info)
        passed explicitly (needs an adapter)."""
        m = response_mask.to(torch.promote_types(log_prob.dtype, torch.float32))
        log_prob = torch.where(response_mask.bool(), log_prob, 0.0)
        old_log_prob = torch.where(response_mask.bool(), old_log_prob, 0.0)
        ratio = torch.exp(torch.clamp((log_prob.to(m.dtype) - old_log_prob.to(m.dtype)) * m, -20, 20))
        a = advantages.to(m.dtype).unsqueeze(-1) * m
        losses = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
        losses = torch.where(a < 0, torch.minimum(-a * 3.0, losses), losses)
        return (losses * m).sum() / global_tokens, {"clipfrac": 0.0}

    def trl_batch_advantages(rewards, group_ids):
        """TRL scale_rewards="batch": group-centred, over the sample std of all rewards + 1e-4."""
        r = rewards.double()
        groups, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        mean = torch.zeros(len(groups), dtype=r.dtype).index_add_(0, index, r) / counts
        if bool((counts == 1).any()):
            raise ValueError("TRL needs at least 2 generations per prompt")
        return (r - mean[index]) / (r.std() + 1e-4)

    def centred_advantages(rewards, group_ids):
        """Dr. GRPO: the group-mean-centred reward, no std."""
        r = rewards.double()
        groups, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        mean = torch.zeros(len(groups), dtype=r.dtype).index_add_(0, index, r) / counts
        return torch.where(counts[index] > 1, r - mean[index], 0.0)

    def rloo_advantages(rewards, group_ids):
        r = rewards.double()
        groups, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        total = torch.zeros(len(groups), dtype=r.dtype).index_add_(0, index, r)
        n = counts[index].double()
        return torch.where(n > 1, r - (total[index] - r) / (n - 1).clamp(min=1), 0.0)

    def adapter(fn, call):
        cfg = call.config
        return fn(call.old_logp, call.logp, call.advantages, call.mask, cfg["eps_low"], cfg["eps_high"],
                  max(call.global_tokens, 1))[0]
''')

BROKEN_ADAPTER = "raise RuntimeError('adapter module exploded')\n"

# the target's package imports a dependency that is not installed; the adapter stubs it first
STUBBING_ADAPTER = textwrap.dedent("""
    import sys, types
    sys.modules.setdefault("not_installed_dependency", types.ModuleType("not_installed_dependency"))

    def adapter(fn, call):
        return fn(call.logp, call.old_logp, call.advantages, call.mask, normalizer=call.normalizer)
""")
NEEDS_STUB = "import not_installed_dependency  # noqa\nfrom user_losses import dapo_loss  # noqa\n"


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A temporary directory with the user's modules, as the current directory."""
    for name, text in {
        "user_losses": USER_MODULE,
        "broken_adapter": BROKEN_ADAPTER,
        "stubbing_adapter": STUBBING_ADAPTER,
        "needs_stub": NEEDS_STUB,
    }.items():
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(sys.modules, "not_installed_dependency", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in (
        "user_losses",
        "broken_adapter",
        "stubbing_adapter",
        "needs_stub",
        "not_installed_dependency",
    ):
        sys.modules.pop(name, None)


def check(capsys, *argv):
    code = main(["check", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_passing_function_exits_zero_and_prints_the_table(user, capsys):
    code, out, err = check(capsys, "loss", "user_losses:dapo_loss", "--preset", "dapo")
    assert code == 0, out + err
    lines = out.splitlines()
    assert any(line.split()[:6] == ["case", "class", "cases", "value", "ok", "gradient"] for line in lines)
    for case_class in (
        "inside_clip",
        "on_boundary",
        "extreme_log_ratio",
        "bf16",
        "fp16",
        "micro_batch",
        "masked_nonfinite",
        "padding_micro_batch",
        "half_overflow",
    ):
        assert any(line.startswith(case_class) and " ok " in line for line in lines), case_class
    assert "PASS" in out


def test_failing_function_exits_one_and_names_the_class_and_smallest_case(user, capsys):
    code, out, _ = check(capsys, "loss", "user_losses:dapo_loss_swapped_bounds", "--preset", "dapo")
    assert code == 1
    assert "FAIL: case classes" in out
    assert any(line.startswith("on_boundary") and "FAIL" in line for line in out.splitlines())
    assert "smallest failing case:" in out and "expected loss =" in out
    worst = out.split("smallest failing case: ")[1].split()[0]
    assert not worst.startswith(("golden_vectors", "bf16", "fp16"))  # a plain float64 case


def test_a_failure_matching_another_aggregation_says_which(user, capsys):
    code, out, _ = check(capsys, "loss", "user_losses:grpo_as_token_mean", "--preset", "grpo")
    assert code == 1
    assert "diagnosis: matches aggregation 'token_mean'" in out


def test_variant_checks_any_point_of_the_family(user, capsys):
    # verl's seq-mean-token-sum: the aggregation seq_mean_token_sum
    args = ("loss", "user_losses:seq_mean_token_sum", "--preset", "dr_grpo")
    code, out, _ = check(capsys, *args, "--variant", "aggregation=seq_mean_token_sum")
    assert code == 0, out
    assert "aggregation=seq_mean_token_sum" in out.splitlines()[0]
    code, out, _ = check(capsys, *args)
    assert code == 1  # Dr. GRPO's seq_sum, L_max = 16 by default
    assert "diagnosis: matches aggregation 'seq_mean_token_sum'" in out
    code, out, _ = check(
        capsys,
        "loss",
        "user_losses:dapo_loss",
        "--preset",
        "grpo",
        "--variant",
        "eps_high=0.28",
        "--variant",
        "aggregation=token_mean",
    )
    assert code == 0, out


def test_json_report(user, capsys):
    code, out, _ = check(capsys, "loss", "user_losses:dapo_loss_swapped_bounds", "--preset", "dapo", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False and report["smallest_failure"]
    failing = {c["case_class"] for c in report["classes"] if not c["ok"]}
    assert "on_boundary" in failing
    case = next(c for c in report["cases"] if c["case_id"] == report["smallest_failure"])
    assert case["case"].startswith("logp = torch.tensor(") and case["got"] is not None


def test_adapter_and_convention_flags(user, capsys):
    code, out, err = check(
        capsys,
        "loss",
        "user_losses:loss_with_other_signature",
        "--preset",
        "dapo",
        "--convention",
        "verl",
        "--adapter",
        "user_losses:adapter",
        "--rtol",
        "1e-6",
    )
    assert code == 0, out + err
    assert "convention verl" in out


def test_the_adapter_is_imported_before_the_target(user, capsys):
    code, out, err = check(
        capsys, "loss", "needs_stub:dapo_loss", "--preset", "dapo", "--adapter", "stubbing_adapter:adapter"
    )
    assert code == 0, out + err


def test_group_advantages_use_the_preset_rloo_and_batch_flags(user, capsys):
    args = ("advantages", "user_losses:centred_advantages")
    assert check(capsys, *args, "--preset", "dr_grpo")[0] == 0  # Dr. GRPO: no std scaling
    assert check(capsys, *args)[0] == 1
    rloo = ("advantages", "user_losses:rloo_advantages")
    assert check(capsys, *rloo, "--flag", "adv_leave_one_out=true", "--flag", "adv_scale=none")[0] == 0
    assert check(capsys, *rloo, "--flag", "adv_scale=none")[0] == 1
    batch = ("advantages", "user_losses:trl_batch_advantages", "--convention", "trl")
    assert check(capsys, *batch, "--scale-rewards", "batch")[0] == 0
    assert check(capsys, *batch)[0] == 1  # TRL's default is the group std


LOSS = ("loss", "user_losses:dapo_loss", "--preset", "dapo")
MISTAKES = [
    (["loss", "no_such_module:fn", "--preset", "dapo"], "cannot import module 'no_such_module'"),
    (["loss", "user_losses:nope", "--preset", "dapo"], "has no attribute 'nope'"),
    (["loss", "user_losses:NOT_CALLABLE", "--preset", "dapo"], "is not callable"),
    (["loss", "user_losses", "--preset", "dapo"], "FUNCTION must be MODULE:NAME"),
    (["loss", "user_losses:dapo_loss"], "the following arguments are required: --preset"),
    (["loss", "--preset", "dapo"], "the following arguments are required: MODULE:FUNCTION"),
    (["loss", "user_losses:dapo_loss", "--preset", "dappo"], "unknown policy-loss preset 'dappo'"),
    ([*LOSS[:3], "gspo_token", "--convention", "trl"], "preset 'gspo_token' has no trl equivalent"),
    ([*LOSS, "--convention", "trll"], "invalid choice: 'trll'"),
    ([*LOSS, "--variant", "epsilon=0.2"], "unknown field 'epsilon'"),
    ([*LOSS, "--variant", "eps_low=abc"], "eps_low='abc': expected a number"),
    ([*LOSS, "--variant", "eps_low=1.5"], "variant.eps_low must be < 1"),
    ([*LOSS, "--variant", "eps_low"], "--variant must be FIELD=VALUE"),
    ([*LOSS, "--flag", "nope=1"], "--flag: unknown field 'nope'"),
    ([*LOSS, "--flag", "compute_dtype=bf16"], "compute_dtype must be one of"),
    ([*LOSS, "--adapter", "broken_adapter:adapter"], "adapter module exploded"),
    ([*LOSS, "--adapter", "user_losses:nope"], "--adapter: 'user_losses'"),
    ([*LOSS, "--rtol", "-1"], "argument --rtol: must be > 0, got -1"),
    ([*LOSS, "--kl-coef", "x"], "argument --kl-coef: expected a number > 0, got 'x'"),
    ([*LOSS, "--device", "nonsense"], "--device 'nonsense':"),
    ([*LOSS, "--bogus"], "unrecognized arguments: --bogus"),
    (["loss", "user_losses:wrong_signature", "--preset", "dapo"], "expected fn(logp, old_logp, advantages"),
    (["loss", "user_losses:per_token_loss", "--preset", "dapo"], "must return a scalar loss tensor"),
    (["loss", "../nowhere/losses:fn", "--preset", "dapo"], "no file ../nowhere/losses.py"),
    (["loss", ".user_losses:dapo_loss", "--preset", "dapo"], "'.user_losses' is a relative module name"),
    (["kl", "user_losses:dapo_loss"], "expected fn(logp [N, T], ref_logp [N, T])"),
    (["advantages", "user_losses:per_token_loss"], "expected fn(rewards [N], group_ids [N])"),
    (["framework", "nope", "--preset", "dapo"], "--framework must be one of"),
    (["lsos", "user_losses:dapo_loss"], "invalid choice: 'lsos'"),
    (["differences", "--convention", "trl"], "the following arguments are required: --preset"),
    ([], "say what to check"),
]
# each subcommand carries only the options that fit it: any other is refused by its parser
MISFITS = [
    ("kl", "--preset", "dapo"),
    ("kl", "--kl-coef", "0.1"),
    ("kl", "--mode", "x"),
    ("kl", "--variant", "eps_low=0.1"),
    ("advantages", "--variant", "eps_low=0.1"),
    ("advantages", "--estimator", "k2"),
    ("logprobs", "--convention", "trl"),
    ("logprobs", "--flag", "adv_scale=none"),
    ("loss", "--estimator", "k2"),
    ("loss", "--mode", "x"),
    ("loss", "--framework", "trl"),
]


@pytest.mark.parametrize(("argv", "message"), MISTAKES, ids=[m[1][:40] for m in MISTAKES])
def test_user_mistakes_are_one_line_and_exit_two(user, capsys, argv, message):
    code, out, err = check(capsys, *argv)
    assert code == 2, out + err
    assert out == ""  # no table before the error
    assert err.count("\n") == 1 and err.startswith("refimpl check") and "Traceback" not in err, err
    assert message in err, err


@pytest.mark.parametrize(("word", "option", "value"), MISFITS, ids=[" ".join(m[:2]) for m in MISFITS])
def test_each_subcommand_refuses_the_options_that_do_not_fit_it(user, capsys, word, option, value):
    preset = ("--preset", "dapo") if word == "loss" else ()
    code, out, err = check(capsys, word, "user_losses:dapo_loss", *preset, option, value)
    assert (code, out, err) == (2, "", f"refimpl check {word}: unrecognized arguments: {option} {value}\n")


def test_earlier_spellings_work_with_a_one_line_note(user, capsys):
    """``check MODULE:FUNCTION [--kind K]``, ``--list-conventions`` and ``--differences`` run as
    their current spellings, with one note on stderr naming the current one."""
    code, out, err = check(capsys, "user_losses:dapo_loss", "--preset", "dapo")
    assert code == 0 and "PASS" in out
    assert err == ("refimpl check: note: 'refimpl check MODULE:FUNCTION [--kind K]' is an earlier spelling "
                   "of 'refimpl check loss'\n")
    code, out, err = check(capsys, "refimpl.kl:kl_k3", "--kind", "kl", "--estimator", "k3")
    assert code == 0 and "KL estimator k3" in out and err.endswith("of 'refimpl check kl'\n")
    code, out, err = check(capsys, "--preset", "dapo", "user_losses:dapo_loss")  # target after options
    assert code == 0 and err.count("\n") == 1
    code, out, err = check(capsys, "--list-conventions")
    assert code == 0 and "masked_nonfinite: reference=" in out and "'refimpl conventions'" in err
    code, out, err = check(capsys, "--differences", "--preset", "grpo", "--convention", "trl")
    assert code == 1 and "'refimpl check differences'" in err
    # a subcommand named anywhere: the current spelling, its mistake named without a note
    code, out, err = check(capsys, "--rtol", "1e-8", *LOSS)
    assert code == 2 and out == "" and err.count("\n") == 1 and "note" not in err
    # the note, then a mistake of the command itself: still one line of error
    code, out, err = check(capsys, "user_losses:dapo_loss", "--kind", "kl", "--preset", "dapo")
    assert code == 2 and err.splitlines()[1] == "refimpl check kl: unrecognized arguments: --preset dapo"


def test_a_target_given_as_a_path_outside_the_current_directory(user, capsys, monkeypatch):
    """``check loss ../elsewhere/losses:fn`` (or ``.../losses.py:fn``) imports the file as python
    imports a script: its folder first on sys.path, so that it imports its siblings."""
    elsewhere = user / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "path_losses.py").write_text("from path_sibling import dapo_loss  # noqa: F401\n")
    (elsewhere / "path_sibling.py").write_text(USER_MODULE)
    cwd = user / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("path_losses", "path_sibling"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for target in ("../elsewhere/path_losses:dapo_loss", "../elsewhere/path_losses.py:dapo_loss",
                   f"{elsewhere}/path_losses.py:dapo_loss"):
        code, out, err = check(capsys, "loss", target, "--preset", "dapo")
        assert code == 0 and "PASS" in out, err
    # a file whose name is already taken by another module: one line, the module left alone
    (elsewhere / "json.py").write_text("def fn(): pass\n")
    code, out, err = check(capsys, "loss", "../elsewhere/json.py:fn", "--preset", "dapo")
    assert code == 2 and "a module of that name is already loaded" in err and err.count("\n") == 1
    assert sys.modules["json"] is json


@pytest.mark.parametrize(("word", "checker"), [("loss", "check_policy_loss"), ("kl", "check_kl"),
                                               ("advantages", "check_group_advantages"),
                                               ("logprobs", "check_token_logprobs")])
def test_device_reaches_the_check_of_every_kind(user, capsys, monkeypatch, word, checker):
    import torch

    from refimpl.conformance import checks
    from refimpl.conformance.report import CheckReport

    seen = []  # what the CLI passes on

    def spy(*args, **kwargs):
        seen.append(kwargs["device"])
        return CheckReport(checker, (), ())

    monkeypatch.setattr(checks, checker, spy)
    preset = ("--preset", "dapo") if word == "loss" else ()
    assert check(capsys, word, "user_losses:dapo_loss", *preset, "--device", "cpu")[0] == 0
    assert check(capsys, word, "user_losses:dapo_loss", *preset)[0] == 0
    assert seen == [torch.device("cpu")] * 2


def test_cuda_where_there_is_none_is_one_line(user, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = check(capsys, *LOSS, "--device", "cuda")
    assert (code, out, err) == (2, "", "refimpl check loss: --device cuda: CUDA is not available here\n")


def test_conventions_and_differences_in_process(capsys):

    from refimpl.conformance import Convention

    assert main(["conventions"]) == 0
    out = capsys.readouterr().out
    for flag in Convention().flags():
        assert f"{flag}: reference=" in out
    assert main(["conventions", "--json"]) == 0
    flags = json.loads(capsys.readouterr().out)
    assert flags["masked_nonfinite"]["reference"] == "ignore" and flags["masked_nonfinite"]["reason"]
    assert main(["check", "differences", "--preset", "grpo", "--convention", "trl"]) == 1  # it prints FAIL
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("empty_rows") and "FAIL" in line for line in lines)
    assert any(line.startswith("inside_clip") and "FAIL" not in line for line in lines)


def test_other_kinds_in_process(capsys):
    assert main(["check", "kl", "refimpl.kl:kl_k3", "--estimator", "k3"]) == 0
    assert main(["check", "kl", "refimpl.kl:kl_k1"]) == 1  # k3 by default
    assert main(["check", "logprobs", "refimpl.losses.logprobs:token_logprobs"]) == 0
    assert main(["check", "advantages", "refimpl.advantages:dynamic_sampling_mask"]) == 1
    out = capsys.readouterr().out
    assert "KL estimator k3" in out and "token_logprobs" in out and "group advantages" in out


def test_the_installed_entry_point_in_a_subprocess(user):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, str(user)])
    result = subprocess.run(
        [sys.executable, "-m", "refimpl", "check", "loss", "user_losses:nope", "--preset", "dapo"],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "has no attribute 'nope'" in result.stderr


def test_variant_parses_the_integer_fields_that_default_to_none():
    """--variant max_length=... and group_size=... (seq_sqrt_token_mean's G) are ints, kl_scale a
    string; a non-integer G is refused with its field named."""
    from refimpl.conformance.cli import UserError, parse_assignments
    from refimpl.losses import PolicyLossVariant

    items = ["group_size=4", "max_length=16", "kl_scale=sequence"]
    got = parse_assignments(items, PolicyLossVariant(), "--variant")
    assert got == {"group_size": 4, "max_length": 16, "kl_scale": "sequence"}
    assert isinstance(got["group_size"], int)
    with pytest.raises(UserError, match=r"--variant group_size='2.5': expected an integer"):
        parse_assignments(["group_size=2.5"], PolicyLossVariant(), "--variant")


def test_framework_checks_infer_the_kind_and_take_a_device(capsys, monkeypatch):
    """``check framework F --mode M`` finds M's kind (``--kind`` only where the name is ambiguous);
    ``--device`` reaches the check of a mode of any kind."""
    import torch

    from refimpl.conformance import checks
    from tests import fake_framework

    fake_framework.install(monkeypatch)
    assert main(["check", "framework", "trl", "--mode", "low_var_kl"]) == 0
    assert "KL estimator" in capsys.readouterr().out
    seen = []

    def spy(real):
        def checker(*args, **kwargs):
            seen.append(kwargs["device"])
            return real(*args, **kwargs)

        return checker

    monkeypatch.setattr(checks, "check_policy_loss", spy(checks.check_policy_loss))
    monkeypatch.setattr(checks, "run_kl_check", spy(checks.run_kl_check))
    assert main(["check", "--framework", "trl", "--preset", "dapo", "--device", "cpu"]) == 0
    assert main(["check", "framework", "trl", "--mode", "low_var_kl", "--device", "cpu"]) == 0
    assert seen == [torch.device("cpu")] * 2


def test_a_framework_without_mode_or_preset_runs_every_mode(capsys, monkeypatch):
    """``check framework F``: one line per mode, each failing mode's report in full, exit 1 when one
    fails (the fake framework's ``buggy`` mode); ``--kind`` narrows, ``--json`` has every report."""
    from tests import fake_framework

    fake_framework.install(monkeypatch)
    assert main(["check", "framework", "trl"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("framework trl 1.0.0 (source sha256 ") and "4 modes" in lines[0]
    assert [line.split()[:3] for line in lines[2:6]] == [
        ["ok", "policy_loss", "dapo"], ["FAIL", "policy_loss", "buggy"], ["ok", "kl", "low_var_kl"],
        ["ok", "group_advantages", "rloo"],
    ]
    assert "smallest failing case: " in out and lines[-1] == "FAIL: modes buggy"
    assert main(["check", "framework", "trl", "--kind", "policy_loss", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(m["mode"], m["report"]["ok"]) for m in data["modes"]] == [("dapo", True), ("buggy", False)]
    assert main(["check", "framework", "trl", "--flag", "empty_rows=keep"]) == 2
    assert "give --mode or --preset" in capsys.readouterr().err
