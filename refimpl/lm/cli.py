"""``refimpl train``, ``refimpl eval``, ``refimpl sample`` and ``refimpl compare``: the tiny-LM
trainer from the command line.

Every ``TrainConfig`` field is an option (``--loss dapo``, ``--group-size 8``, ``--kl-coef 0.01``
...), its help listing the allowed values; ``--resume CKPT`` continues a run exactly in the
checkpoint's own folder (its stored config; ``--steps`` may extend it). Every user error is one
line on stderr and exit status 2. Multi-process: ``torchrun --nproc-per-node 2 -m refimpl train``.

Exit codes of ``refimpl train`` (``refimpl.lm.run.EXIT_*``): 0 done; 1 a non-finite loss or
gradient (the last good checkpoint kept); 2 the run cannot start (a user mistake, a folder another
trainer holds), nothing done; 74 a file of the run could not be written (disk full, quota,
permissions: the last checkpoint kept, the partial file removed); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing

__all__ = ["register", "DEFAULT_THREADS"]

_SKIP = {"extra"}

# CPU threads of a run unless OMP_NUM_THREADS says otherwise, picked by ``benchmarks/trainer.py
# --threads`` (30 warm-up + 2 RL steps, default model, timed inside each process, best of 3) on this
# project's 2-core machine already loaded by other jobs (load average 6-7): 1 thread 6.6 s wall /
# 3.2 s CPU vs 2 threads 33.8 / 16.9 with no extra job, and 11.8 / 2.9 vs 28.4 / 11.6 beside one
# CPU-bound job. The tiny model's kernels are too small to share out; a second thread only spins
# and waits for a core.
DEFAULT_THREADS = 1


def _default_threads() -> None:
    """``torch.set_num_threads(DEFAULT_THREADS)`` unless the user set ``OMP_NUM_THREADS``."""
    import os

    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(DEFAULT_THREADS)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool(text: str) -> bool:
    """``true`` or ``false`` (any case: ``True`` as the help's defaults print it), nothing else."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _choice(options: tuple[str, ...]):
    def parse(text: str) -> str:
        if text not in options:
            raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {', '.join(options)})")
        return text

    parse.__name__ = "choice"
    return parse


def _one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """argparse prints the usage block before an error; here the error is one line (exit 2)."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = error
    return parser


def _field_choices() -> dict[str, tuple[str, ...]]:
    from refimpl.lm.config import _FIELD_RULES, LOSS_ALIASES, LOSS_NAMES
    from refimpl.lm.tasks import TASKS

    choices = {"task": tuple(sorted(TASKS)), "loss": (*LOSS_NAMES, *LOSS_ALIASES)}
    for name, rule in _FIELD_RULES.items():
        if rule[-1] is not None:
            choices[name] = tuple(rule[-1])
    return choices


_HELP_NOTES = {
    "device": "auto (CUDA when present), cpu, cuda or cuda:N",
    "top_k": "0 = off",
    "loss": "ppo_rlhf = PPO-RLHF (value head, GAE, KL in the reward); ppo: its deprecated alias",
    "sft_target_accuracy": "held-out sampled accuracy that ends the warm-up",
    "ref_reset_every": "0 = never",
}


def _help_note(name: str) -> str | None:
    """The option's note: what None means comes from the recipes (refimpl.lm.recipes)."""
    from refimpl.lm.recipes import RECIPE_DEFAULTED, recipe_default_note

    notes = [_HELP_NOTES.get(name), recipe_default_note(name) if name in RECIPE_DEFAULTED else None]
    return "; ".join(note for note in notes if note) or None


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    from refimpl.lm.train import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    defaults = TrainConfig()
    choices = _field_choices()
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SKIP:
            continue
        hint = str(hints[f.name])
        default = getattr(defaults, f.name)
        allowed = choices.get(f.name)
        if allowed is not None:
            kind, what = _choice(allowed), f"one of {', '.join(allowed)}"
        elif "bool" in hint:
            kind, what = _bool, "true or false"
        elif "int" in hint:
            kind, what = int, "an integer"
        elif "float" in hint:
            kind, what = float, "a number"
        else:
            kind, what = str, ""
        if "None" in hint and not (allowed and "none" in allowed):  # "none" is then a value
            kind, what = _optional(kind), f"{what} or none"
        note = _help_note(f.name)
        help_text = "; ".join(part for part in (what, note, f"default: {default}") if part)
        # default=None: only options given explicitly override the config (or a resumed one)
        parser.add_argument(
            _option(f.name),
            dest=f.name,
            type=kind,
            default=None,
            metavar=f.name.upper() if allowed is None else "{" + ",".join(allowed) + "}",
            help=help_text,
        )


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def invoked_program() -> str:
    """The command that started this ``refimpl``, as a shell runs it again from the same folder:
    the console script as it was invoked (``.venv/bin/refimpl``; ``refimpl`` where PATH finds that
    same file), ``PYTHON -m refimpl``, or ``torchrun --nproc-per-node N -m refimpl`` for a
    multi-process run. Embedded (``main()`` called by another program): this interpreter's
    ``-m refimpl``."""
    import os
    import shlex

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun: exact resume needs the same number of processes
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        nodes = f" --nnodes {world // local}" if local != world else ""
        return f"torchrun{nodes} --nproc-per-node {local} -m refimpl"
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in ("refimpl", "refimpl.__main__"):
        typed = getattr(sys, "orig_argv", [sys.executable])[0]
        return f"{_as_typed(typed, sys.executable)} -m refimpl"
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "refimpl" and os.path.isfile(script):
        return _as_typed("refimpl", script)
    return f"{shlex.quote(sys.executable)} -m refimpl"


def _as_typed(short: str, path: str) -> str:
    """``short`` where the shell's PATH (or the folder, for a relative path) finds the file
    ``path`` under it; else ``path`` itself, quoted for the shell."""
    import os
    import shlex
    import shutil

    found = shutil.which(short)
    if found is not None and os.path.exists(path) and os.path.samefile(found, path):
        return shlex.quote(short)
    return shlex.quote(path)


def _train(args: argparse.Namespace) -> int:
    from refimpl.lm.run import RunError, run_training
    from refimpl.lm.train import TrainConfig

    _default_threads()
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name not in _SKIP and getattr(args, f.name) is not None
    }
    output = "quiet" if args.quiet else True
    if args.resume is not None:
        unsupported = sorted(set(given) - {"steps"})
        if unsupported:
            return _error(
                f"--resume continues the stored config; only --steps may change (got "
                f"{', '.join(_option(k) for k in unsupported)})"
            )
        if args.init_from is not None:
            return _error("--init-from starts a new run; --resume continues one: give only one")
        config = None
    else:
        try:
            config = TrainConfig(**given)
        except (TypeError, ValueError) as err:
            return _error(str(err))
    try:
        return run_training(
            config,
            args.out,
            resume=args.resume,
            init_from=args.init_from,
            progress=output,
            steps_override=given.get("steps") if args.resume is not None else None,
            overwrite=args.overwrite,
            program=invoked_program(),
        )
    except RunError as err:
        return _error(str(err))


def _eval(args: argparse.Namespace) -> int:
    from refimpl.lm.run import evaluate_checkpoint
    from refimpl.lm.train import resolve_device

    _default_threads()

    try:
        resolve_device(args.device)
        result = evaluate_checkpoint(args.checkpoint, device=args.device)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        return _error(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    print(json.dumps(result))
    return 0


def _sample(args: argparse.Namespace) -> int:
    from refimpl.lm.run import sample_checkpoint

    _default_threads()

    try:
        lines = sample_checkpoint(args.checkpoint, n=args.n, seed=args.seed, device=args.device)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        return _error(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    print("\n".join(lines))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from refimpl.lm.files import IOFailure
    from refimpl.lm.plots import compare_runs
    from refimpl.lm.run import EXIT_WRITE_FAILED

    for run_dir in args.runs:
        if not (Path(run_dir) / "metrics.jsonl").is_file():
            return _error(f"RUN_DIR: {run_dir} holds no metrics.jsonl (give folders of refimpl train)")
    from refimpl.lm.plots import image_formats

    out = Path(args.out)
    if out.is_dir():
        return _error(f"--out: {out} is a folder; give a .png file name")
    formats = image_formats()
    if out.suffix.lower().lstrip(".") not in formats:
        return _error(
            f"--out: {out} is not an image file name (give one ending in .png, or any of "
            f"{', '.join('.' + f for f in formats)})"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        compare_runs(args.runs, out)
    except OSError as err:  # a full disk: as refimpl train, one line and exit 74
        print(f"error: {IOFailure(err.filename or out, err)}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except ValueError as err:  # a damaged metrics.jsonl (MetricsError), one line naming the line
        return _error(f"RUN_DIR: {err}")
    print(f"plot: {out}")
    return 0


def register(subparsers) -> None:
    """Add the ``train``, ``eval``, ``sample`` and ``compare`` subcommands."""
    from refimpl.lm.train import LOSS_NAMES

    train = subparsers.add_parser(
        "train",
        help="train a tiny LM: supervised warm-up, then RL with a verified loss preset",
        description="Warm-up until held-out sampled accuracy reaches --sft-target-accuracy, then RL "
        f"(--loss: {', '.join(LOSS_NAMES)}). Writes metrics.jsonl, checkpoint.pt, "
        "summary.json and curves.png to --out.",
    )
    _add_config_options(train)
    train.add_argument(
        "--out", default=None, help="output folder (default: the --resume checkpoint's folder, or runs/train)"
    )
    train.add_argument(
        "--resume", default=None, metavar="CKPT", help="continue a run from its checkpoint, exactly"
    )
    train.add_argument(
        "--init-from",
        default=None,
        metavar="CKPT",
        help="start RL from the policy of a checkpoint (e.g. a saved warm-up), skipping the warm-up",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its metrics, checkpoint, config, summary and plot are "
        "deleted first); without it such a folder is refused",
    )
    train.add_argument("--quiet", action="store_true", help="print only the closing summary")
    train.set_defaults(func=_train)
    _one_line_errors(train)

    evaluate = subparsers.add_parser("eval", help="held-out greedy and sampled accuracy of a checkpoint")
    evaluate.add_argument("checkpoint", metavar="CKPT")
    evaluate.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    evaluate.set_defaults(func=_eval)
    _one_line_errors(evaluate)

    sample = subparsers.add_parser("sample", help="a few held-out prompts with sampled answers and rewards")
    sample.add_argument("checkpoint", metavar="CKPT")
    sample.add_argument("--n", type=int, default=8, help="number of prompts (default: 8)")
    sample.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    sample.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    sample.set_defaults(func=_sample)
    _one_line_errors(sample)

    compare = subparsers.add_parser("compare", help="overlay several runs' curves in one PNG")
    compare.add_argument("runs", nargs="+", metavar="RUN_DIR", help="folders written by refimpl train")
    compare.add_argument("--out", default="runs/compare.png", help="PNG file (default: runs/compare.png)")
    compare.set_defaults(func=_compare)
    _one_line_errors(compare)
