"""``refimpl train`` and ``refimpl eval``: the tiny-LM trainer from the command line.

Every ``TrainConfig`` field is an option (``--loss dapo``, ``--group-size 8``, ``--kl-coef 0.01``
...); ``--resume CKPT`` continues a run exactly (its stored config; ``--steps`` may extend it).
Multi-process: ``torchrun --nproc-per-node 2 -m refimpl train ...`` (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing

__all__ = ["register"]

_SKIP = {"extra"}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    from refimpl.lm.train import LOSS_NAMES, TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SKIP:
            continue
        hint = str(hints[f.name])
        default = getattr(defaults, f.name)
        if "bool" in hint:
            kind = _bool
        elif "int" in hint:
            kind = int
        elif "float" in hint:
            kind = float
        else:
            kind = str
        if "None" in hint:
            kind = _optional(kind)
        extra = {"choices": LOSS_NAMES} if f.name == "loss" else {}
        # default=None: only options given explicitly override the config (or a resumed one)
        parser.add_argument(
            _option(f.name), dest=f.name, type=kind, default=None, help=f"default: {default}", **extra
        )


def _train(args: argparse.Namespace) -> int:
    from refimpl.lm.train import TrainConfig, run_training

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name not in _SKIP and getattr(args, f.name) is not None
    }
    if args.resume is not None:
        unsupported = sorted(set(given) - {"steps"})
        if unsupported:
            print(
                f"error: --resume continues the stored config; only --steps may change (got "
                f"{', '.join(_option(k) for k in unsupported)})",
                file=sys.stderr,
            )
            return 2
        return run_training(
            TrainConfig(),
            args.out,
            resume=args.resume,
            progress=not args.quiet,
            steps_override=given.get("steps"),
        )
    try:
        config = TrainConfig(**given)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_training(config, args.out, progress=not args.quiet)


def _eval(args: argparse.Namespace) -> int:
    from refimpl.lm.train import evaluate_checkpoint

    try:
        result = evaluate_checkpoint(args.checkpoint, device=args.device)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


def register(subparsers) -> None:
    """Add the ``train`` and ``eval`` subcommands."""
    train = subparsers.add_parser(
        "train",
        help="train a tiny LM: supervised warm-up, then RL with a verified loss preset",
        description="Warm-up until held-out sampled accuracy reaches --sft-target-accuracy, then RL "
        "(--loss: grpo, dr_grpo, dapo, bnpo, gspo, gspo_token, sapo, cispo, or ppo = PPO-RLHF). "
        "Writes metrics.jsonl, checkpoint.pt, summary.json and curves.png to --out.",
    )
    _add_config_options(train)
    train.add_argument("--out", default="runs/train", help="output folder (default: runs/train)")
    train.add_argument("--resume", default=None, metavar="CKPT", help="continue a run from its checkpoint")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)

    evaluate = subparsers.add_parser("eval", help="held-out greedy and sampled accuracy of a checkpoint")
    evaluate.add_argument("checkpoint", metavar="CKPT")
    evaluate.add_argument("--device", default="auto")
    evaluate.set_defaults(func=_eval)
