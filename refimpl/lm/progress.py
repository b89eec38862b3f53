"""What a run prints: a progress bar on a terminal, plain periodic lines otherwise (a log file, CI),
the closing summary only with ``--quiet``. Held-out accuracy comes first on every line."""

from __future__ import annotations

import sys

__all__ = ["Progress", "rl_line", "format_duration"]

_WARMUP_LINE_EVERY = 10  # in "lines" mode, one warm-up line every this many evaluations


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def rl_line(record: dict, last_eval: dict) -> str:
    """One RL step in a line: held-out sampled and greedy accuracy (the latest evaluation) first,
    then the training samples' accuracy (and reward when it differs, e.g. partial credit or
    DAPO's overlong penalty), KL, entropy, clip fraction."""
    parts = [
        f"held-out sampled {_pct(last_eval.get('eval_sampled_accuracy'))}"
        f" greedy {_pct(last_eval.get('eval_greedy_accuracy'))}",
        f"train acc {_pct(record.get('accuracy'))}",
    ]
    reward, accuracy = record.get("reward"), record.get("accuracy")
    if reward is not None and reward != accuracy:
        parts[-1] += f" reward {reward:.3f}"
    extra = [
        f"{label} {record[key]:.{digits}f}"
        for key, label, digits in (("kl", "kl", 4), ("entropy", "ent", 2), ("clip_fraction", "clip", 3))
        if isinstance(record.get(key), float)
    ]
    return " | ".join(parts + ([" ".join(extra)] if extra else []))


class Progress:
    """``mode``: "bar" (tqdm on a terminal), "lines" (periodic plain lines) or "quiet"."""

    def __init__(self, config, mode: str):
        self.config, self.mode = config, mode
        self.bar = None
        self._evals = 0

    def _print(self, text: str) -> None:
        if self.mode == "bar" and self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        elif self.mode != "quiet":
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    # -------------------------------------------------------------- warm-up

    def start_warmup(self, sft_step: int, last_eval: dict) -> None:
        c = self.config
        self._print(
            f"warm-up: next-token training until held-out sampled accuracy >= {_pct(c.sft_target_accuracy)} "
            f"(evaluated every {c.sft_eval_every} steps, at most {c.sft_max_steps} steps)"
        )
        if self.mode == "bar":
            from tqdm import tqdm

            # the bar fills as held-out sampled accuracy approaches its target: what the warm-up waits for
            self.bar = tqdm(
                total=max(c.sft_target_accuracy, 1e-12),
                initial=min(last_eval.get("eval_sampled_accuracy", 0.0), c.sft_target_accuracy),
                bar_format="warm-up |{bar:20}| {desc} [{elapsed}]",
                dynamic_ncols=True,
            )
            self._warmup_postfix(sft_step, last_eval)
            self.bar.refresh()

    def _warmup_postfix(self, sft_step: int, record: dict, loss: float | None = None) -> None:
        acc = record.get("eval_sampled_accuracy")
        text = f"sampled {_pct(acc)} of target {_pct(self.config.sft_target_accuracy)}, step {sft_step}"
        if loss is not None:
            text += f", loss {loss:.3f}"
        self.bar.set_description_str(text, refresh=False)

    def warmup_step(self, record: dict) -> None:
        if "eval_sampled_accuracy" not in record:
            return
        self._evals += 1
        acc = record["eval_sampled_accuracy"]
        if self.mode == "bar":
            self.bar.n = min(acc, self.config.sft_target_accuracy)
            self._warmup_postfix(record["sft_step"], record, record["sft_loss"])
            self.bar.refresh()
        elif self.mode == "lines" and self._evals % _WARMUP_LINE_EVERY == 0:
            self._print(
                f"warm-up step {record['sft_step']}: held-out sampled {_pct(acc)} "
                f"greedy {_pct(record['eval_greedy_accuracy'])} | loss {record['sft_loss']:.3f}"
            )

    def end_warmup(self, sft_step: int, warmup_eval: dict) -> None:
        self.close()
        c = self.config
        sampled = warmup_eval.get("eval_sampled_accuracy")
        reached = sampled is not None and sampled >= c.sft_target_accuracy
        verdict = "target reached" if reached else f"target {_pct(c.sft_target_accuracy)} NOT reached"
        self._print(
            f"warm-up done after {sft_step} steps ({verdict}): held-out sampled {_pct(sampled)} "
            f"greedy {_pct(warmup_eval.get('eval_greedy_accuracy'))}; starting RL"
        )

    # -------------------------------------------------------------- RL

    def start_rl(self, step: int) -> None:
        c = self.config
        self._print(f"RL: {c.steps} steps of {c.loss}, {c.prompts_per_step} prompts x {c.group_size} samples")
        if self.mode == "bar":
            from tqdm import tqdm

            # held-out accuracy right after a short bar: a narrow terminal cuts the line's end only
            self.bar = tqdm(
                total=c.steps,
                initial=step,
                bar_format="RL {n_fmt}/{total_fmt} |{bar:12}| {desc} [{elapsed}<{remaining}]",
                dynamic_ncols=True,
            )

    def rl_step(self, record: dict, last_eval: dict) -> None:
        line = rl_line(record, last_eval)
        if self.mode == "bar":
            self.bar.update(1)
            self.bar.set_description_str(line, refresh=False)
            self.bar.refresh()
        elif self.mode == "lines" and "eval_greedy_accuracy" in record:
            self._print(f"RL step {record['step']}/{self.config.steps}: {line}")

    def end_rl(self) -> None:
        self.close()

    # -------------------------------------------------------------- the end

    def summary(self, summary: dict, folder, plotted: bool) -> None:
        """The closing lines (printed in every mode, ``--quiet`` included)."""
        c = self.config
        lines = [
            f"done: {summary['steps']} RL steps ({c.task}, loss {c.loss}, seed {c.seed}) in "
            f"{format_duration(summary['wall_time'])} wall, {summary['cpu_time']:.0f} s CPU, "
            f"on {summary['device']}",
            f"held-out accuracy: greedy {_pct(summary.get('final_eval_greedy_accuracy'))}, sampled "
            f"{_pct(summary.get('final_eval_sampled_accuracy'))} (after the {summary['warmup_steps']}-step "
            f"warm-up: greedy {_pct(summary.get('warmup_eval_greedy_accuracy'))}, sampled "
            f"{_pct(summary.get('warmup_eval_sampled_accuracy'))})",
        ]
        if plotted:
            lines.append(f"plot:       {folder.plot}")
        lines += [
            f"metrics:    {folder.metrics}",
            f"checkpoint: {folder.checkpoint}",
            f"summary:    {folder.summary}",
        ]
        print("\n".join(lines), flush=True)
