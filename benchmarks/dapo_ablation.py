"""DAPO's ablation at toy scale (Yu et al. 2025, Table 1; issue 13): the tiny LM trained with
GRPO, then with DAPO's parts added one at a time in the order of that table (overlong filtering,
clip-higher, soft overlong penalty, token-level loss, dynamic sampling; never a KL term), several
seeds each, every run starting from ONE shared warm-up checkpoint (``refimpl train --steps 0``
writes it; each run is ``refimpl train --init-from`` it). Prints, per configuration, the mean and
min-max over seeds of the final held-out sampled and greedy accuracy, the RL steps to 90 % held-out
greedy accuracy (evaluated every ``--eval-every`` steps; runs that never get there are counted) and
the truncation rate (the fraction of sampled responses that hit ``max_new_tokens`` without EOS,
averaged over the run's RL steps).

Run: ``python benchmarks/dapo_ablation.py [--steps 100] [--jobs 2] [--seeds 3] [--out runs/dapo_ablation]``;
``--quick`` (a few tiny steps, 1 seed, 2 configurations, well under a minute) is what the test runs.

Task and length limit. 3-digit addition (answers of 3 or 4 reversed digits, then EOS: 4 or 5
tokens) with ``--max-new-tokens 6``, one token above the longest correct answer, and a soft overlong
penalty with a cache of 1 token (penalty -1 at length 6, which no correct answer reaches). 6 is the
tightest limit that keeps every answer reachable (at 5 a cache of 1 would punish every correct
4-digit answer; at 4 half the problems could not be answered). A response is truncated when its
first 6 tokens hold no EOS: it kept emitting digits. Measured on the warm-up policy (4096 samples of
the held-out prompts at temperature 1): 0.02 % truncated at limit 6, 0.12 % at 7, 0.07 % at the
trainer's default 8 (each its own warm-up to 15 % sampled accuracy); 0.8 % after only 100 warm-up
steps (accuracy 0, no signal for RL), 4.8 % at temperature 2. The toy task's answer length is
learned early in the warm-up, so the rate is non-zero but small whatever the limit: overlong
filtering and the soft penalty have little to act on here (the table's truncation column shows
it), unlike DAPO's long chains of thought. All other settings are the trainer's defaults (64
prompts x 8 samples per step, 2 inner epochs x 2 minibatches, lr 5e-4 decaying over the run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's refimpl, run from anywhere
from refimpl.lm.config import TrainConfig  # noqa: E402
from refimpl.lm.run import run_training  # noqa: E402

# Yu et al. 2025, Table 1, in its order: each row adds its change to the row above (cumulative); every
# configuration is the "grpo" recipe (kl_coef 0) with TrainConfig overrides
LADDER: tuple[tuple[str, dict], ...] = (
    ("GRPO", {}),
    ("+ overlong filtering", {"overlong_filter": True}),
    ("+ clip-higher", {"eps_high": 0.28}),
    ("+ soft overlong penalty", {"overlong_cache_len": 1}),
    ("+ token-level loss", {"aggregation": "token_mean"}),
    ("+ dynamic sampling", {"dynamic_sampling": True}),
)

# Yu et al. 2025, Table 1 (AIME'24 avg@32, 32B model)
PAPER = {
    "GRPO": "30%",
    "+ overlong filtering": "36%",
    "+ clip-higher": "38%",
    "+ soft overlong penalty": "41%",
    "+ token-level loss": "42%",
    "+ dynamic sampling": "50%",
}

QUICK = dict(
    sft_max_steps=20,
    steps=2,
    prompts_per_step=8,
    group_size=4,
    eval_size=64,
    eval_every=1,
    sft_eval_every=10,
)


def configurations(base: TrainConfig, count: int | None = None) -> list[tuple[str, TrainConfig]]:
    """The first ``count`` rows of ``LADDER`` as configs, each adding its change to the previous."""
    rows, changes = [], {}
    for name, change in LADDER[:count]:
        changes = {**changes, **change}
        rows.append((name, dataclasses.replace(base, **changes)))
    return rows


def run_metrics(run_dir: Path, target: float = 0.9) -> dict:
    """One run's numbers from its folder: final held-out accuracies (summary.json), the first RL step
    whose held-out greedy accuracy reaches ``target`` (None if none) and the mean truncation rate."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if r.get("phase") == "rl"]
    reached = [r["step"] for r in rl if r.get("eval_greedy_accuracy", -1.0) >= target]
    rates = [r["truncation_rate"] for r in rl]
    return {
        "sampled": summary["final_eval_sampled_accuracy"],
        "greedy": summary["final_eval_greedy_accuracy"],
        "steps_to_90": reached[0] if reached else None,
        "truncation": sum(rates) / len(rates) if rates else math.nan,
    }


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(sum(values) / len(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summarise(rows: list[tuple[str, list[dict]]]) -> str:
    """The Markdown table: mean (min-max) over seeds per configuration."""
    lines = [
        "| configuration | paper (AIME'24) | sampled acc. | greedy acc. | steps to 90 % greedy "
        "| truncation |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in rows:
        reached = [r["steps_to_90"] for r in runs if r["steps_to_90"] is not None]
        to90 = _spread(reached, "{:.0f}") if reached else "-"
        to90 += f" [{len(reached)}/{len(runs)} runs]"
        lines.append(
            f"| {name} | {PAPER[name]} | {_spread([100 * r['sampled'] for r in runs], '{:.1f}')} | "
            f"{_spread([100 * r['greedy'] for r in runs], '{:.1f}')} | {to90} | "
            f"{_spread([100 * r['truncation'] for r in runs], '{:.2f}')} % |"
        )
    return "\n".join(lines)


def _train(config: TrainConfig, run_dir: Path, init_from: Path | None = None) -> int:
    """One ``refimpl train`` run into ``run_dir``, its closing summary kept in ``run_dir/log.txt``. Only
    runs without a summary reach here: an interrupted run's files are replaced (``overwrite``)."""
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        code = run_training(config, run_dir, init_from=init_from, progress="quiet", plot=False,
                            overwrite=True)
    (run_dir / "log.txt").write_text(log.getvalue())
    return code


def _slug(name: str) -> str:
    return name.strip("+ ").replace(" ", "_").replace("-", "_")


def _run_all(todo: list[tuple[TrainConfig, Path]], init_from: Path, jobs: int) -> None:
    """The runs ``todo``, ``jobs`` processes at a time (in this process when 1)."""
    if jobs == 1:
        codes = [_train(config, run_dir, init_from) for config, run_dir in todo]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_threads) as pool:
            futures = [pool.submit(_train, config, run_dir, init_from) for config, run_dir in todo]
            codes = [future.result() for future in futures]
    for (_, run_dir), code in zip(todo, codes, strict=True):
        if code:
            raise SystemExit(f"{run_dir}: training failed (exit {code})")


def _worker_threads() -> None:
    import torch

    torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/dapo_ablation", help="folder for the warm-up and the runs")
    parser.add_argument("--steps", type=int, default=100, help="RL steps per run (default: 100)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration (default: 3)")
    parser.add_argument("--max-new-tokens", type=int, default=6, help="generation limit (default: 6)")
    parser.add_argument("--eval-every", type=int, default=5, help="held-out evaluation period (default: 5)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, one process each (default: 1)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run: 1 seed, 2 configurations")
    args = parser.parse_args(argv)
    if min(args.steps, args.seeds, args.jobs) < 1:
        parser.error("--steps, --seeds and --jobs: expected >= 1")
    out = Path(args.out)
    base = TrainConfig(
        task="addition",
        loss="grpo",
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        eval_every=args.eval_every,
        lr_decay_steps=args.steps,
    )
    seeds, count = args.seeds, None
    if args.quick:
        base = dataclasses.replace(base, **QUICK)
        seeds, count = 1, 2
    assert base.kl_coef is None and TrainConfig(loss="grpo").kl_coef is None  # grpo's own: 0, no KL term
    t0 = time.perf_counter()
    warm = out / "warmup"
    if not (warm / "checkpoint.pt").is_file():  # the one shared warm-up (RL steps 0)
        code = _train(dataclasses.replace(base, steps=0), warm)
        if code:
            raise SystemExit(f"warm-up failed (exit {code})")
    warmup = json.loads((warm / "summary.json").read_text())
    todo, rows = [], []
    for name, config in configurations(base, count):
        dirs = [out / _slug(name) / f"seed{seed}" for seed in range(seeds)]
        todo += [
            (dataclasses.replace(config, seed=seed), run_dir)
            for seed, run_dir in enumerate(dirs)
            if not (run_dir / "summary.json").is_file()  # a finished run is kept (re-running resumes)
        ]
        rows.append((name, dirs))
    _run_all(todo, warm / "checkpoint.pt", args.jobs)
    rows = [(name, [run_metrics(d) for d in dirs]) for name, dirs in rows]
    header = (
        f"DAPO ablation at toy scale: addition, max_new_tokens {base.max_new_tokens}, {base.steps} RL steps, "
        f"{seeds} seed(s) per row from one warm-up ({warmup['warmup_steps']} steps; held-out sampled "
        f"{100 * warmup['warmup_eval_sampled_accuracy']:.1f} %, greedy "
        f"{100 * warmup['warmup_eval_greedy_accuracy']:.1f} %); mean (min-max) over seeds; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    text = header + "\n\n" + summarise(rows)
    print(text)
    return text


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    main(sys.argv[1:])
