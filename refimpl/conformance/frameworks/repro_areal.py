"""AReaL's standalone reproductions of the findings in its group-advantage, whitening, KL-reward and
overlong-penalty modes (areal_kinds.py) and of GSPO/SAPO's fixed aggregation: ``areal_bodies(areal)``
returns them keyed as repro_bodies.py's ``BODIES``, given its preamble that loads AReaL's functional.py."""

from __future__ import annotations

__all__ = ["areal_bodies"]

# AReaL's utils/data.py imports its infrastructure: the two classes are executed from the installed file
_AREAL_DATA = """\
import ast  # noqa: E402

import numpy as np  # noqa: E402  (data.py's own)
import torch.distributed as dist  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("areal").submodule_search_locations)))
source = (root / "utils" / "data.py").read_text()
data = {"torch": torch, "np": np, "dist": dist, "NormConfig": object}  # NormConfig: an annotation only
for node in ast.parse(source).body:  # the classes' code as installed (decorators included), nothing else
    if isinstance(node, ast.ClassDef) and node.name in ("Normalization", "KLEstimator"):
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(root / "utils" / "data.py"), "exec"), data)


def norm(**config):
    return data["Normalization"](types.SimpleNamespace(**{"mean_leave1out": False, "std_unbiased": True,
                                                           "eps": 1e-5, **config}))


# two responses of one group, rewards (1, 0), of 3 and 1 tokens: per-token advantages with the loss mask
x = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
"""


def areal_bodies(areal: str) -> dict[tuple[str, str], str]:
    """AReaL's later findings' script bodies; ``areal``: repro_bodies.py's preamble for functional.py."""
    _AREAL = areal
    return {
        ("areal", "adv_weighting"): _AREAL_DATA + """\
out = norm(mean_level="group", std_level=None, group_size=2)(x, mask)
got = [round(out[0, 0].item(), 6), round(out[1, 0].item(), 6)]
verdict("AReaL Normalization(mean_level='group', std_level=None) on per-token advantages with the loss mask "
        "(utils/data.py:1520), T = (3, 1), R = (1, 0): the advantages", got,
        "[0.5, -0.5] (R minus the mean of the group's responses)", got == [0.25, -0.75])
""",
        ("areal", "adv_leave_one_out_unit"): _AREAL_DATA + """\
out = norm(mean_level="group", mean_leave1out=True, std_level=None, group_size=2)(x, mask)
got = [round(out[0, 0].item(), 6), round(out[1, 0].item(), 6)]
verdict("AReaL Normalization(mean_level='group', mean_leave1out=True) on per-token advantages "
        "(utils/data.py:1541), T = (3, 1), R = (1, 0): the advantages", got,
        "[1.0, -1.0] (R minus the other response's reward)", got == [0.333333, -1.0])
""",
        ("areal", "adv_trailing_partial"): _AREAL_DATA + """\
rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])  # two groups of 2 and a trailing group of 1
got = norm(mean_level="group", std_level="group", group_size=2)(rewards).tolist()
verdict("AReaL Normalization(mean_level='group', std_level='group', group_size=2, eps=1e-5) "
        "(utils/data.py:1424) on 5 rewards: the trailing sample's advantage", got[-1],
        "0, an error or R (a group of one has no baseline), never R / eps", got[-1] > 9e4)
""",
        ("areal", "kl_reward_value_clamp"): _AREAL_DATA + """\
kl = data["KLEstimator"]("k1")(torch.tensor([0.0]), torch.tensor([-12.0])).item()
verdict("AReaL KLEstimator('k1') (utils/data.py:1655), log pi - log pi_ref = 12: the estimate the KL reward "
        "uses", kl, "12.0 (k1 = log pi - log pi_ref)", kl == 10.0)
""",
        ("areal", "whiten_one_pass_dtype"): _AREAL + """\
x = torch.tensor([1e8 + 1.0, 1e8 - 1.0, 1e8 + 1.0, 1e8 - 1.0], dtype=torch.float64)  # mean 1e8, std 1
got = functional.masked_normalization(x, eps=0.0, all_reduce=False).tolist()
verdict("AReaL masked_normalization (utils/functional/functional.py:50), float64 x = 1e8 +- 1, eps 0: the "
        "whitened values", got, "[1.0, -1.0, 1.0, -1.0] (two-pass variance 1)",
        all(abs(v) == float("inf") for v in got))
""",
        ("areal", "overlong_floor"): _AREAL + """\
data = {"rewards": torch.zeros(1), "input_ids": torch.zeros(1, 30, dtype=torch.long),
        "loss_mask": torch.ones(1, 30)}  # one response of 30 tokens
got = functional.reward_overlong_penalty(data, overlong_tokens=5, overlong_penalty_factor=1.0,
                                         max_response_length=20)["rewards"].item()
verdict("AReaL reward_overlong_penalty (utils/functional/functional.py:797), a 30-token response, "
        "max_response_length 20, overlong_tokens 5, factor 1: the penalty", got,
        "-1.0 (DAPO: -1 beyond the budget)", got == -3.0)
""",
        ("areal", "fixed_aggregation"): _AREAL + """\
logp = torch.zeros(2, 3, requires_grad=True)  # rows of 3 and 1 tokens, A = 1, ratio 1
mask = torch.tensor([[True, True, True], [True, False, False]])
adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
loss, _ = functional.ppo_actor_loss_fn(logp, torch.zeros(2, 3), torch.zeros(2, 3), adv, 3e-4, mask,
                                       eps_clip_higher=4e-4, importance_sampling_level="sequence")
grad = torch.autograd.grad(loss, logp)[0]
got = [round(grad[0, 0].item(), 6), round(grad[1, 0].item(), 6)]
verdict("AReaL ppo_actor_loss_fn(importance_sampling_level='sequence') (GSPO, "
        "utils/functional/functional.py:542), T = (3, 1): d loss / d logp of each row's first token", got,
        "[-0.166667, -0.5] (GSPO's seq_mean: -A / (N T_i))", got == [-0.25, -0.25])
""",
    }
