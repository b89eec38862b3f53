"""Before / after of the eager closed form (``refimpl/losses/closed_form.py``, what ``policy_loss`` runs),
and what its ``approx_kl`` metric costs, against the frameworks on the same tensors (issue 29, item 1).

One process, interleaved rounds (benchmarks/timing.py ``median_times``: thread CPU time, 1 thread,
the order shuffled each round, medians; ``spread`` the largest interquartile range over median), float32
log-probs with ragged masks (benchmarks/losses.py ``make_batch``), forward + backward of:

- ``ours``: this tree's ``closed_form_policy_loss`` called directly (``policy_loss``'s input checks
  read no values: a few microseconds);
- ``base`` (``--baseline FILE``, repeatable: ``base2``, ...): another version of closed_form.py, e.g.
  ``git show 40062c3:refimpl/losses/closed_form.py > /tmp/base.py``;
- ``no_kl`` (``--without-approx-kl``): this tree's closed form with approx_kl's k3 series replaced
  by 0 (the metric's share of the time; a measurement, not a loss to run);
- ``ref`` (``--reference``): ``reference_policy_loss``, whose allocations also move the others'
  times as they do in benchmarks/losses.py;
- every installed framework's own function on the preset (benchmarks/peers.py), the fastest of them
  ``best``.

With ``--alone`` each closed form instead runs ``--rounds`` calls back to back, nothing between them
(as a training loop calls the loss, less the model), the versions one after the other; no framework.

Usage: ``python benchmarks/closed_form_ab.py [--size 256x2048] [--presets gspo cispo] [--rounds 31]
[--baseline FILE] [--without-approx-kl] [--reference] [--alone]``.
"""

from __future__ import annotations

import argparse

import torch
from losses import _cpu_name, _load, _size, load_module, loss_step, make_batch  # benchmarks/losses.py
from peers import peer_steps  # benchmarks/peers.py
from timing import median_times  # benchmarks/timing.py

from refimpl.losses import PRESETS, reference_policy_loss

_OPTIONAL = {"ref_logp": None, "behavior_logp": None, "entropy": None, "kl": None}


def _closed_form(path: str | None, name: str):
    """A fresh copy of closed_form.py (this tree's, or ``path``) as module ``name``."""
    if path is None:
        import refimpl.losses.closed_form as ours

        path = ours.__file__
    return load_module(path, name)


def _step(module, batch: dict, variant):
    def step() -> None:
        logp = batch["logp"].detach().requires_grad_(True)
        loss, _ = module.closed_form_policy_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                                                 variant, _OPTIONAL, None)
        loss.backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=_size, default=(256, 2048), help="N x T (default 256x2048)")
    parser.add_argument("--presets", nargs="+", default=["gspo", "cispo"], choices=list(PRESETS))
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--baseline", metavar="FILE", action="append", default=[],
                        help="another version of closed_form.py (repeatable)")
    parser.add_argument("--without-approx-kl", action="store_true", help="also ours with k3 replaced by 0")
    parser.add_argument("--reference", action="store_true", help="also reference_policy_loss")
    parser.add_argument("--alone", action="store_true", help="each version alone, calls back to back")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    n, t = args.size
    batch = make_batch(n, t, device)
    modules = {"ours": _closed_form(None, "closed_form_ours")}
    for i, path in enumerate(args.baseline):
        label = "base" if i == 0 else f"base{i + 1}"
        modules[label] = _closed_form(path, f"closed_form_{label}")
    if args.without_approx_kl:
        modules["no_kl"] = _closed_form(None, "closed_form_no_kl")
        modules["no_kl"]._k3_sum = lambda x, *rest: x.new_zeros(())
    peers = [] if args.alone else peer_steps(batch, args.presets, say=lambda *_: None)
    print(f"device: CPU ({_cpu_name()}), torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability()}, 1 thread")
    how = "calls back to back per version" if args.alone else "interleaved rounds"
    print(f"[N={n}, T={t}] float32, ragged masks: forward + backward, medians of {args.rounds} {how} "
          f"(thread CPU time); {_load()}")
    for name in args.presets:
        variant = PRESETS[name]
        fns = {label: _step(module, batch, variant) for label, module in modules.items()}
        if args.reference:
            fns["ref"] = lambda v=variant: loss_step(batch, v, reference_policy_loss)
        theirs = {f"{p.framework.split()[0]}": p.step for p in peers if p.preset == name}
        if args.alone:
            median, spread = {}, 0.0
            for label, fn in fns.items():
                one, spread_one = median_times({label: fn}, device, args.rounds)
                median.update(one)
                spread = max(spread, spread_one)
        else:
            median, spread = median_times({**fns, **theirs}, device, args.rounds)
        best = min(theirs, key=median.get) if theirs else None
        cells = [f"{label} {median[label] * 1e3:.3f} ms" for label in fns]
        if best is not None:
            cells.append(f"best {best} {median[best] * 1e3:.3f} ms")
            cells += [f"{label}/best {median[label] / median[best]:.2f}" for label in modules]
        print(f"{name:8s} " + ", ".join(cells) + f"; spread {spread:.2f}", flush=True)


if __name__ == "__main__":
    main()
