"""The verl driver's standalone reproductions beyond repro_bodies.py's first ones (findings in
verl/findings.py): ``verl_bodies(verl, silent, config)`` returns them keyed as ``BODIES``, given
repro_bodies.py's verl preamble (stand-ins, ``core_algos``, ``ActorConfig``), its warnings-as-errors
preamble and its ``ActorConfig`` writer."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["verl_bodies"]

_HELPER = """\
rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
"""


def verl_bodies(verl: str, silent: str, config: Callable[..., str]) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("verl", "kl_value_clamp"): verl + """\
logp = torch.tensor([-3.0], dtype=torch.float64, requires_grad=True)  # ref_logp - logp = 3
kl = core_algos.kl_penalty(logp, torch.zeros(1, dtype=torch.float64), "low_var_kl")
grad = torch.autograd.grad(kl.sum(), logp)[0].item()
x = 3.0
verdict("verl kl_penalty(..., 'low_var_kl') (trainer/ppo/core_algos.py:2245), ref_logp - logp = 3: k3 and "
        "d k3 / d logp", f"{kl.item()}, {grad}", f"{torch.tensor(x).expm1().item() - x}, "
        f"{-torch.tensor(x).expm1().item()} (kl.md eq. (4), no clamp)", kl.item() == 10.0 and grad == 0.0)
""",
        ("verl", "rejection_sampling_returns"): verl + _HELPER + """\
# one response of 3 tokens, the outcome score 1 on its last token (where the reward managers put it);
# the trainer's rejection sampling (token_k1, bounds 0.5_2) rejects that token, then GAE runs on the mask
rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
values = torch.zeros(1, 3, dtype=torch.float64)
log_ratio = torch.tensor([[0.0, 0.0, 1.5]], dtype=torch.float64)  # log(pi_train / pi_rollout) per token
mask, _ = rollout_corr.compute_rollout_rejection_mask(log_ratio, torch.ones(1, 3, dtype=torch.float64),
                                                       rollout_rs="token_k1", rollout_rs_threshold="0.5_2")
_, returns = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
verdict("verl rollout_rs (trainer/ppo/rollout_corr_helper.py:1061 rewrites response_mask) then "
        "compute_gae_advantage_return, gamma = lambda = 1: the returns of the kept tokens",
        f"{returns[0, :2].tolist()} (mask {mask.tolist()})",
        "[1.0, 1.0] (the score is a reward of the response)",
        bool(mask[0, 2] == 0) and returns[0, :2].tolist() == [0.0, 0.0])
""",
        ("verl", "rs_k1_bounds"): verl + _HELPER + """\
ratio = torch.tensor([[0.6, 1.9]], dtype=torch.float64)  # pi_train / pi_rollout of two tokens
mask, _ = rollout_corr.compute_rollout_rejection_mask(torch.log(ratio), torch.ones(1, 2, dtype=torch.float64),
                                                       rollout_rs="token_k1", rollout_rs_threshold="0.5_1.5")
verdict("verl compute_rollout_rejection_mask (trainer/ppo/rollout_corr_helper.py:263), token_k1 with the "
        "ratio bounds 0.5_1.5: keep-mask of the ratios (0.6, 1.9)", mask.tolist(),
        "[[1.0, 0.0]] (0.6 inside [0.5, 1.5], 1.9 above it)", mask.tolist() == [[0.0, 1.0]])
""",
        ("verl", "geo_mean_is_weights"): verl
        + config("clip_ratio_low=0.4, clip_ratio_high=0.4,", "geo_mean") + """\
T = 20
old = torch.zeros(1, T, dtype=torch.float64)
logp = torch.zeros(1, T, dtype=torch.float64, requires_grad=True)  # on-policy: every ratio 1
weights = torch.ones(1, T, dtype=torch.float64)
weights[0, -1] = 0.0  # one token's rollout weight set to 0 (IcePop: outside its lower_upper bounds)
loss, _ = core_algos.compute_policy_loss_geo_mean(old, logp, torch.ones(1, T, dtype=torch.float64),
                                                  torch.ones(1, T, dtype=torch.bool),
                                                  loss_agg_mode="token-mean", config=config,
                                                  rollout_is_weights=weights)
verdict("verl compute_policy_loss_geo_mean (trainer/ppo/core_algos.py:1996), A = 1, T = 20, one token "
        "weight 0: the loss", loss.item(), "0.0 (the sequence's weight exp(mean log w) is 0)",
        abs(loss.item()) > 0.1)
""",
        ("verl", "gpg_alpha"): verl + """\
import numpy as np  # noqa: E402

rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=torch.float64)  # group a: 1, 0; group b: 0, 0
index = np.array(["a", "a", "b", "b"], dtype=object)
adv, _ = core_algos.compute_gpg_outcome_advantage(rewards, torch.ones(4, 1, dtype=torch.float64), index)
# GPG: alpha = B / (B - M), M = 2 samples with advantage 0 (group b): alpha 2, advantages (1, -1, 0, 0)
verdict("verl compute_gpg_outcome_advantage (trainer/ppo/core_algos.py:810), 0/1 rewards (1, 0 | 0, 0)",
        adv[:, 0].tolist(), [1.0, -1.0, 0.0, 0.0], adv[:, 0].tolist() == [2.0, -2.0, 0.0, 0.0])
""",
        ("verl", "dapo_filter"): """\
stand_ins("ray", "tensordict", "orjson", "transfer_queue")
replay = load_file("verl", "trainer/ppo/v1/replay_buffer.py")  # not its package __init__ (the agent loop)
# finished groups: "a" three rewards 0.1 (constant), "b" one sample (a singleton), "c" rewards 1, 0 (kept)
scores = {"a_0_0": 0.1, "a_0_1": 0.1, "a_0_2": 0.1, "b_0_0": 1.0, "c_0_0": 1.0, "c_0_1": 0.0}
replay.tq = types.SimpleNamespace(kv_batch_get=lambda keys, partition_id, select_fields: {
    "rm_scores": [torch.tensor([0.0, scores[k]], dtype=torch.float64) for k in keys]})
from collections import defaultdict  # noqa: E402

buffer = types.SimpleNamespace(
    filter_groups_metric="reward", finished_keys={"train": {"a", "b", "c"}},
    _dapo_classification_cache=defaultdict(dict), partitions={"train": dict.fromkeys(scores, {})})
dropped, _ = replay.ReplayBuffer._dapo_filtered_keys(buffer, "train")
verdict("verl ReplayBuffer._dapo_filtered_keys (trainer/ppo/v1/replay_buffer.py:312), groups a = (0.1, 0.1, "
        "0.1), b = (1.0,), c = (1.0, 0.0): the groups dropped", sorted(dropped),
        "['a', 'b'] (advantages.md eq. (7): equal rewards, and the singleton)", sorted(dropped) != ["a", "b"])
""",
        ("verl", "rejection_sampling_sessions"): verl + """\
import ast  # noqa: E402
from typing import Any, Optional  # noqa: E402

import numpy as np  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("verl").submodule_search_locations)))
namespace = {"torch": torch, "np": np, "core_algos": core_algos, "Any": Any, "Optional": Optional,
             "AdvantageEstimator": core_algos.AdvantageEstimator, "DataProto": object, "AlgoConfig": object}
for relative, name in (("trainer/ppo/ray_trainer.py", "compute_advantage"),
                       ("trainer/ppo/v1/utils.py", "compute_advantage_for_multi_trajectories")):
    path = root / relative  # the two defs as installed (their modules import the training stack)
    node = next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)


class Batch:  # what the two functions read of a DataProto: .batch, .non_tensor_batch, select_idxs, len
    def __init__(self, batch, non_tensor_batch):
        self.batch, self.non_tensor_batch = batch, non_tensor_batch

    def select_idxs(self, idxs):
        return Batch({k: v[idxs] for k, v in self.batch.items()},
                     {k: v[idxs] for k, v in self.non_tensor_batch.items()})

    def __len__(self):
        return len(self.batch["response_mask"])


# prompt u: session s0 has two outputs (a first turn, then its final output), session s1 one; the final
# outputs score 1 and 0. Sequence-level rejection sampling emptied the mask of s0's final output (row 1)
# before the advantages (v1/trainer_base.py:1771 then 1775); s0's first turn (row 0) is not rejected.
keys = ["u_s0_0", "u_s0_1", "u_s1_0"]
scores = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
data = Batch({"token_level_rewards": scores, "response_mask": mask},
             {"uid": np.array(["u", "u", "u"], dtype=object)})
out = namespace["compute_advantage_for_multi_trajectories"](data, batch_keys=keys,
                                                            adv_estimator=core_algos.AdvantageEstimator.GRPO)
first_turn = out.batch["advantages"][0].tolist()
exact = (1.0 - 0.5) / (float(torch.tensor([1.0, 0.0]).std()) + 1e-6)  # the session's GRPO advantage
verdict("verl compute_advantage_for_multi_trajectories (trainer/ppo/v1/utils.py:208), GRPO, the session's "
        "final output rejected: the advantages of its unrejected first turn", first_turn, [exact, exact],
        first_turn == [0.0, 0.0])
""",
        ("verl", "config:clip_ratio_c"): silent + verl + config("clip_ratio_c=1.1,", "vanilla") + """\
old = torch.tensor([[-1.0]], dtype=torch.float64)
logp = torch.tensor([[-1.0 + 0.1397619424]], dtype=torch.float64, requires_grad=True)  # ratio 1.15
loss, _ = core_algos.compute_policy_loss_vanilla(old, logp, -torch.ones(1, 1, dtype=torch.float64),
                                                 torch.ones(1, 1, dtype=torch.bool),
                                                 loss_agg_mode="token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("verl ActorConfig(clip_ratio_c=1.1) (trainer/ppo/core_algos.py:1331 asserts only > 1), "
        "compute_policy_loss_vanilla: d loss / d logp of an A < 0 token at ratio 1.15 (inside [0.8, 1.2])",
        f"{grad} (accepted: no error, no warning)", "1.15 (-A r; c must be >= 1 + clip_ratio_high)",
        grad == 0.0)
""",
        ("verl", "micro_batch"): verl + config("", "geo_mean") + """\
# one mini-batch of 4 on-policy responses (2 tokens, A = 1), trained as 2 micro-batches of 2 rows: the
# engine calls the loss per micro-batch and sums them (workers/engine/fsdp/transformer_impl.py:761-767)
old = torch.zeros(4, 2, dtype=torch.float64)
logp = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
adv, mask = torch.ones(4, 2, dtype=torch.float64), torch.ones(4, 2, dtype=torch.bool)
total = sum(core_algos.compute_policy_loss_geo_mean(old[i:i + 2], logp[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                                                    loss_agg_mode="token-mean", config=config)[0]
            for i in (0, 2))
grad = torch.autograd.grad(total, logp)[0][0, 0].item()
verdict("verl compute_policy_loss_geo_mean (trainer/ppo/core_algos.py:2000: torch.mean over the "
        "micro-batch), 4 rows A = 1 in 2 micro-batches, summed as the engine sums them: loss and "
        "d loss / d logp[0, 0]",
        f"{total.item()}, {grad}", "-1.0, -0.125 (the mean over the mini-batch's 4 rows: "
        "policy_losses.md eq. (11))", total.item() == -2.0 and grad == -0.25)
""",
        ("verl", "config:clip_ratio_low"): silent + verl + config("clip_ratio_low=-0.1,", "vanilla") + """\
old = torch.tensor([[-1.0]], dtype=torch.float64)
logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)  # on-policy: ratio 1
loss, _ = core_algos.compute_policy_loss_vanilla(old, logp, -torch.ones(1, 1, dtype=torch.float64),
                                                 torch.ones(1, 1, dtype=torch.bool),
                                                 loss_agg_mode="token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("verl ActorConfig(clip_ratio_low=-0.1) (trainer/ppo/core_algos.py:1348, the band [1.1, 1.2]), "
        "compute_policy_loss_vanilla: d loss / d logp of an on-policy token (ratio 1) with A = -1",
        f"{grad} (accepted: no error, no warning)",
        "1.0 (-A r; or an error: clip_ratio_low must be in [0, 1], policy_losses.md eq. (6))", grad == 0.0)
""",
        ("verl", "config:loss_scale_factor"): silent + verl
        + config("loss_agg_mode='seq-mean-token-sum-norm', loss_scale_factor=-1,", "vanilla") + """\
# ppo_loss passes the config's factor with the global counts (workers/utils/losses.py:65-68)
config.global_batch_info.update(dp_size=1, batch_num_tokens=4, global_batch_size=1,
                                loss_scale_factor=config.loss_scale_factor)
old = torch.zeros(1, 4, dtype=torch.float64)
logp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)  # one on-policy response, 4 tokens, A = 1
loss, _ = core_algos.compute_policy_loss_vanilla(old, logp, torch.ones(1, 4, dtype=torch.float64),
                                                 torch.ones(1, 4, dtype=torch.bool),
                                                 loss_agg_mode="seq-mean-token-sum-norm", config=config)
grad = torch.autograd.grad(loss, logp)[0][0, 0].item()
verdict("verl ActorConfig(loss_scale_factor=-1) (trainer/ppo/core_algos.py:1193 divides by it unchecked), "
        "seq-mean-token-sum-norm, A = 1: loss and d loss / d logp (a descent step raises the loss)",
        f"{loss.item()}, {grad} (accepted: no error, no warning)",
        "an error: L_max must be >= every response's length (policy_losses.md eq. (11))", loss.item() > 0)
""",
        ("verl", "dppo_truncation_cap"): verl + config("", "dppo_tv") + """\
old = torch.tensor([[0.05]], dtype=torch.float64).log()
# ratio 10; for A < 0 the TV mask keeps the token (pi - pi_old = 0.45 >= -clip_ratio_low)
logp = torch.tensor([[0.5]], dtype=torch.float64).log().requires_grad_()
loss, _ = core_algos.compute_policy_loss_dppo_tv(old, logp, -torch.ones(1, 1, dtype=torch.float64),
                                                 torch.ones(1, 1, dtype=torch.bool),
                                                 loss_agg_mode="token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("verl compute_policy_loss_dppo_tv (trainer/ppo/core_algos.py:1427: config.get('clip_ratio_c', 20.0)) "
        f"with the default ActorConfig (clip_ratio_c = {config.clip_ratio_c}): d loss / d logp at ratio 10, "
        "A = -1",
        grad, "10.0 (the truncation at the code's 20; 'a large threshold is recommended')",
        abs(grad - 3.0) < 1e-12)
""",
        ("verl", "seq_sum_width"): verl + config("loss_agg_mode='seq-mean-token-sum-norm',", "vanilla") + """\
# the default trainer (trainer.use_v1: true) keeps responses unpadded; ppo_loss pads each micro-batch to its
# own longest response (workers/utils/losses.py:91, to_padded_tensor of the nested tensors). One mini-batch
# of 2 on-policy responses of 2 and 4 tokens (A = 1), rollout.response_length = 8, one row per micro-batch.
lengths, response_length = (2, 4), 8
config.global_batch_info.update(dp_size=1, batch_num_tokens=sum(lengths), global_batch_size=len(lengths),
                                loss_scale_factor=config.loss_scale_factor)  # None: the default
logps = [torch.zeros(n, dtype=torch.float64, requires_grad=True) for n in lengths]
total = 0.0
for logp in logps:
    padded = torch.nested.as_nested_tensor([logp], layout=torch.jagged).to_padded_tensor(0.0)
    ones = torch.ones_like(padded)
    loss, _ = core_algos.compute_policy_loss_vanilla(padded.detach(), padded, ones, ones.bool(),
                                                     loss_agg_mode="seq-mean-token-sum-norm", config=config)
    total = total + loss
grad = torch.autograd.grad(total, logps[0])[0][0].item()
exact = -sum(lengths) / len(lengths) / response_length
verdict("verl agg_loss seq-mean-token-sum-norm, loss_scale_factor=None (trainer/ppo/core_algos.py:1191: "
        "loss_mask.shape[-1]), each micro-batch padded to its longest response: loss and d loss / d logp of "
        "the short response's first token", f"{total.item()}, {grad}",
        f"{exact}, {-1 / len(lengths) / response_length} (actor.yaml: 'If null, uses response_length' = 8)",
        total.item() == -1.0 and grad == -0.25)
""",
    }
