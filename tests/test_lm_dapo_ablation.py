"""The truncation-rate metric and ``benchmarks/dapo_ablation.py`` (issue 13: DAPO's ablation at toy
scale). The full ablation (18 runs) stays out of CI; ``--quick`` runs here."""

from __future__ import annotations

import dataclasses
import json

import torch

from refimpl import losses
from refimpl.lm.config import TrainConfig
from refimpl.lm.experience import Groups, draw_groups
from refimpl.lm.recipes import resolve_recipe
from refimpl.lm.rollout import Rollout
from tests.scripts import load_script


def _ablation():
    return load_script("benchmarks/dapo_ablation.py", "dapo_ablation")


def _groups(rewards: list[float], truncated: list[bool]) -> Groups:
    n, length = len(rewards), 3
    lengths = torch.tensor([length if t else 2 for t in truncated])
    rollout = Rollout(
        torch.zeros(n, 2, dtype=torch.long),
        torch.zeros(n, length, dtype=torch.long),
        lengths,
        torch.tensor(truncated),
        torch.arange(length)[None, :] < lengths[:, None],
        torch.zeros(n, length),
        None,
    )
    reward = torch.tensor(rewards)
    return Groups(rollout, reward, reward, torch.arange(n) // 2)


def test_truncation_rate_counts_every_sample_drawn():
    """Two groups of 2 per round. Round 1: group 0 has signal, group 1 not; round 2: group 0 has
    signal. Dynamic sampling keeps 2 groups after 2 rounds and the rate is over all 8 samples drawn
    (the dropped group's truncated samples included): 4/8. Without it, round 1 only: 3/4."""
    rounds = [
        _groups([1.0, 0.0, 0.0, 0.0], [False, True, True, True]),
        _groups([1.0, 0.0, 1.0, 1.0], [False, False, False, True]),
    ]
    config = TrainConfig(loss="dapo", prompts_per_step=2, group_size=2, max_sampling_rounds=4)
    draws = iter(rounds)
    drawn = draw_groups(lambda: next(draws), config, resolve_recipe(config))
    assert drawn.truncation == 4 / 8 and drawn.kept_fraction == 2 / 4
    assert drawn.groups.rollout.truncated.tolist() == [False, True, False, False]  # the kept samples
    config = dataclasses.replace(config, loss="grpo")
    draws = iter(rounds)
    assert draw_groups(lambda: next(draws), config, resolve_recipe(config)).truncation == 3 / 4


def test_the_ladder_adds_one_part_at_a_time_and_ends_at_dapo():
    ablation = _ablation()
    rows = ablation.configurations(TrainConfig(loss="grpo", max_new_tokens=6))
    names = [name for name, _ in rows]
    assert names == list(ablation.PAPER)  # Yu et al. 2025, Table 1, in its order
    recipes = [resolve_recipe(config) for _, config in rows]
    assert recipes[0].variant == losses.get_preset("grpo")
    assert not any(c.overlong_filter for _, c in rows[:1]) and all(c.overlong_filter for _, c in rows[1:])
    # the last row is DAPO's policy loss (clip-higher, token-level, no KL) with dynamic sampling
    assert recipes[-1].variant == losses.get_preset("dapo") and recipes[-1].variant.kl_coef == 0.0
    assert recipes[-1].dynamic_sampling and recipes[-1].overlong_cache_len == 1
    assert [r.dynamic_sampling for r in recipes] == [False] * 5 + [True]


def test_quick_ablation_runs_from_one_warm_up(tmp_path, capsys):
    ablation = _ablation()
    ablation.QUICK = {**ablation.QUICK, "device": "cpu"}  # not "auto": the same run with or without CUDA
    text = ablation.main(["--quick", "--out", str(tmp_path)])
    assert text in capsys.readouterr().out
    table = [line for line in text.splitlines() if line.startswith("| ")][2:]
    assert [line.split(" | ")[0] for line in table] == ["| GRPO", "| + overlong filtering"]
    first = {}
    for name in ("GRPO", "overlong_filtering"):
        records = [json.loads(line) for line in (tmp_path / name / "seed0" / "metrics.jsonl").open()]
        rl = [r for r in records if r.get("phase") == "rl"]
        assert len(rl) == 2 and all(0.0 <= r["truncation_rate"] <= 1.0 for r in rl)
        first[name] = rl[0]
    grpo, filtered = first["GRPO"], first["overlong_filtering"]
    # the same warm-up policy and seed: the first step draws the same samples ...
    for key in ("reward", "accuracy", "truncation_rate", "response_length"):
        assert grpo[key] == filtered[key], key
    # ... some truncated (the 20-step warm-up policy rarely stops); the filter masks them out, so
    # GRPO's normaliser (non-empty sequences per optimizer step, 32 samples in 2 minibatches) loses
    # exactly the truncated fraction (dyadic numbers: exact in floating point)
    assert grpo["truncation_rate"] > 0 and grpo["normalizer"] == 16.0
    assert filtered["normalizer"] == 16.0 * (1.0 - grpo["truncation_rate"])
