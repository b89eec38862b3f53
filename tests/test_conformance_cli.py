"""``refimpl check MODULE:FUNCTION`` end to end: a user's function in a temporary module, run in a
subprocess exactly as a user would, with the exit code and the printed table checked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

USER_MODULE = textwrap.dedent('''
    import torch

    def dapo_loss(logp, old_logp, advantages, mask, *, normalizer=None):
        """A framework-style DAPO loss (token mean, eps_low 0.2, eps_high 0.28)."""
        dtype = torch.promote_types(logp.dtype, torch.float32)
        mask = mask.bool()
        ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0))
        a = advantages.to(dtype).unsqueeze(-1)
        per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a), 0.0)
        return per_token.sum() / (normalizer or mask.sum().clamp(min=1))

    def dapo_loss_swapped_bounds(logp, old_logp, advantages, mask, *, normalizer=None):
        m = mask.to(torch.promote_types(logp.dtype, torch.float32))
        ratio = torch.exp((logp.to(m.dtype) - old_logp.to(m.dtype)) * m)
        a = advantages.to(m.dtype).unsqueeze(-1)
        per_token = -torch.min(ratio * a, torch.clamp(ratio, 0.72, 1.2) * a)
        return (per_token * m).sum() / (normalizer or m.sum().clamp(min=1))

    def loss_with_other_signature(old_log_prob, log_prob, advantages, response_mask, eps_low, eps_high):
        """verl-like argument order, config passed explicitly (needs an adapter)."""
        m = response_mask.to(torch.promote_types(log_prob.dtype, torch.float32))
        log_prob = torch.where(response_mask.bool(), log_prob, 0.0)
        old_log_prob = torch.where(response_mask.bool(), old_log_prob, 0.0)
        ratio = torch.exp(torch.clamp((log_prob.to(m.dtype) - old_log_prob.to(m.dtype)) * m, -20, 20))
        a = advantages.to(m.dtype).unsqueeze(-1) * m
        losses = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
        losses = torch.where(a < 0, torch.minimum(-a * 3.0, losses), losses)
        return (losses * m).sum() / (m.sum() + 1e-8), {"clipfrac": 0.0}

    def trl_batch_advantages(rewards, group_ids):
        """TRL scale_rewards="batch": group-centred, over the sample std of all rewards + 1e-4."""
        r = rewards.double()
        groups, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        mean = torch.zeros(len(groups), dtype=r.dtype).index_add_(0, index, r) / counts
        if bool((counts == 1).any()):
            raise ValueError("TRL needs at least 2 generations per prompt")
        return (r - mean[index]) / (r.std() + 1e-4)

    def adapter(fn, call):
        cfg = call.config
        return fn(call.old_logp, call.logp, call.advantages, call.mask, cfg["eps_low"], cfg["eps_high"])[0]
''')


def run_check(tmp_path, *args):
    (tmp_path / "user_losses.py").write_text(USER_MODULE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "refimpl", "check", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_passing_function_exits_zero_and_prints_the_table(tmp_path):
    result = run_check(tmp_path, "user_losses:dapo_loss", "--preset", "dapo")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split()[:6] == ["case", "class", "cases", "value", "ok", "gradient"] for line in lines)
    for case_class in ("inside_clip", "on_boundary", "extreme_log_ratio", "bf16", "fp16", "micro_batch"):
        assert any(line.startswith(case_class) and " ok " in line for line in lines), case_class
    assert "PASS" in result.stdout


def test_failing_function_exits_one_and_names_the_class_and_smallest_case(tmp_path):
    result = run_check(tmp_path, "user_losses:dapo_loss_swapped_bounds", "--preset", "dapo")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL: case classes" in result.stdout
    assert any(line.startswith("on_boundary") and "FAIL" in line for line in result.stdout.splitlines())
    assert "smallest failing case:" in result.stdout and "expected loss =" in result.stdout


def test_adapter_and_convention_flags(tmp_path):
    ok = run_check(
        tmp_path,
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
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "convention verl" in ok.stdout


def test_usage_error_exits_two(tmp_path):
    result = run_check(tmp_path, "no_such_module:fn", "--preset", "dapo")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot load" in result.stderr


def test_missing_preset_is_a_usage_error_in_process(capsys):
    from refimpl.conformance.cli import main

    assert main(["check", "tests.test_conformance_zoo:framework_loss"]) == 2
    assert "--preset is required" in capsys.readouterr().err


def test_list_conventions_and_differences_in_process(capsys):
    import dataclasses

    from refimpl.conformance import Convention
    from refimpl.conformance.cli import main

    assert main(["check", "--list-conventions"]) == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(Convention):
        if field.name != "name":
            assert f"{field.name}: reference=" in out
    assert main(["check", "--differences", "--preset", "grpo", "--convention", "trl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("empty_rows") and "FAIL" in line for line in lines)
    assert any(line.startswith("inside_clip") and "FAIL" not in line for line in lines)


def test_other_kinds_in_process(capsys):
    from refimpl.conformance.cli import main

    assert main(["check", "refimpl.kl:kl_k3", "--kind", "kl", "--estimator", "k3"]) == 0
    assert main(["check", "refimpl.kl:kl_k1", "--kind", "kl", "--estimator", "k3"]) == 1
    assert main(["check", "refimpl.losses.logprobs:token_logprobs", "--kind", "token_logprobs"]) == 0
    assert main(["check", "refimpl.advantages:dynamic_sampling_mask", "--kind", "group_advantages"]) == 1
    out = capsys.readouterr().out
    assert "KL estimator k3" in out and "token_logprobs" in out and "group advantages" in out


def test_scale_rewards_batch_selects_trls_batch_rule(tmp_path):
    args = ("user_losses:trl_batch_advantages", "--kind", "group_advantages", "--convention", "trl")
    passing = run_check(tmp_path, *args, "--scale-rewards", "batch")
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert run_check(tmp_path, *args).returncode == 1  # TRL's default is the group std
    wrong_profile = run_check(tmp_path, *args[:-1], "verl", "--scale-rewards", "batch")
    assert wrong_profile.returncode == 2 and "scale_rewards" in wrong_profile.stderr
