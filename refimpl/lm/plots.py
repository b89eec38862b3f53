"""Pictures of runs (matplotlib, Agg backend): one run's curves, and several runs overlaid."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from refimpl.lm.files import write_atomic
from refimpl.lm.history import read_records

__all__ = ["read_metrics", "plot_metrics", "compare_runs", "image_formats"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` (one JSON object a line; a torn last record, left by a
    kill, is left out; damage elsewhere is a ``MetricsError`` naming the line)."""
    records, _ = read_records(Path(path))
    return [r.record for r in records]


def _save(fig, path) -> None:
    """``fig`` written to ``path`` (format from its suffix) atomically: a full disk leaves the old
    file and no partial one, and raises ``IOFailure`` naming the file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=90, format=Path(path).suffix.lstrip(".").lower() or "png")
    write_atomic(path, buffer.getvalue())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image_formats() -> tuple[str, ...]:
    """The file suffixes (without the dot) that the plots can be written as: matplotlib's Agg
    canvas formats (png, pdf, svg, ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return tuple(sorted(FigureCanvasAgg.get_supported_filetypes()))


def _curve(ax, rows, x, key, label, **style) -> None:
    pts = [(r[x], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and key in r]
    if pts:
        ax.plot(*zip(*pts, strict=True), label=label, **style)


def plot_metrics(metrics_path, png_path, title: str = "") -> None:
    """Curves of a run: warm-up loss and held-out accuracy, RL train reward and accuracy,
    held-out greedy / sampled accuracy, KL, entropy and clip fraction. ``title``: e.g. the
    preset and seed."""
    plt = _pyplot()
    records = read_metrics(metrics_path)
    sft = [r for r in records if r.get("phase") == "sft"]
    rl = [r for r in records if r.get("phase") == "rl"]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))

    ax = axes[0, 0]
    _curve(ax, sft, "sft_step", "sft_loss", "next-token loss", color="gray")
    ax.set(title="warm-up", xlabel="warm-up step", ylabel="next-token loss (nats)")
    acc = ax.twinx()
    _curve(acc, sft, "sft_step", "eval_sampled_accuracy", "held-out sampled", color="tab:orange")
    _curve(acc, sft, "sft_step", "eval_greedy_accuracy", "held-out greedy", color="tab:blue")
    acc.set(ylabel="held-out accuracy", ylim=(-0.02, 1.02))
    if acc.lines:
        acc.legend(loc="center right", fontsize=8)

    ax = axes[0, 1]  # accuracy drawn over the reward (dashed) so the two stay visible when equal
    _curve(ax, rl, "step", "reward", "reward", color="tab:green", linewidth=3, alpha=0.5)
    _curve(ax, rl, "step", "accuracy", "accuracy", color="black", linestyle="--", linewidth=1)
    ax.set(title="RL: training samples", ylabel="mean over samples")
    _curve(axes[0, 2], rl, "step", "eval_greedy_accuracy", "greedy", marker=".")
    _curve(axes[0, 2], rl, "step", "eval_sampled_accuracy", "sampled", marker=".")
    axes[0, 2].set(title="RL: held-out accuracy", ylabel="accuracy", ylim=(-0.02, 1.02))
    _curve(axes[1, 0], rl, "step", "kl", "KL to reference (k3)")
    axes[1, 0].set(title="KL", ylabel="KL per token (nats)")
    if not axes[1, 0].lines:
        axes[1, 0].text(0.5, 0.5, "no reference model (KL coefficient 0)", ha="center", va="center")
    _curve(axes[1, 1], rl, "step", "entropy", "entropy per token")
    axes[1, 1].set(title="entropy", ylabel="entropy per token (nats)")
    _curve(axes[1, 2], rl, "step", "clip_fraction", "clip fraction")
    axes[1, 2].set(title="clip fraction", ylabel="fraction of tokens")
    for a in list(axes.flat)[1:]:
        a.set_xlabel("RL step")
        if a.lines:
            a.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, png_path)
    plt.close(fig)


def compare_runs(run_dirs: list, png_path, labels: list[str] | None = None) -> None:
    """Several runs' held-out greedy and sampled accuracy, training reward and KL, overlaid
    (one colour per run), x = RL step. ``labels`` default to each run's preset and seed."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
    panels = [
        ("eval_greedy_accuracy", "held-out greedy accuracy"),
        ("eval_sampled_accuracy", "held-out sampled accuracy"),
        ("reward", "training reward"),
        ("kl", "KL to reference (nats/token)"),
    ]
    for i, run_dir in enumerate(run_dirs):
        run_dir = Path(run_dir)
        rl = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("phase") == "rl"]
        label = labels[i] if labels else _run_label(run_dir)
        for ax, (key, _) in zip(axes, panels, strict=True):
            _curve(ax, rl, "step", key, label, color=f"C{i}")
    for ax, (_, name) in zip(axes, panels, strict=True):
        ax.set(title=name, xlabel="RL step", ylabel=name.split(" (")[0])
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, png_path)
    plt.close(fig)


def _run_label(run_dir: Path) -> str:
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return run_dir.name
    config = json.loads(config_path.read_text())
    return f"{run_dir.name} ({config.get('loss')}, seed {config.get('seed')})"
