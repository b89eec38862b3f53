"""Unsloth's later standalone reproductions (the earlier ones are in repro_bodies.py), keyed as
repro_bodies.py's ``BODIES``; ``unsloth`` is repro_bodies.py's preamble that loads rl_replacements.py
without the package's GPU check, ``silent`` the one that turns warnings into errors."""

from __future__ import annotations

__all__ = ["unsloth_bodies"]


def unsloth_bodies(unsloth: str, silent: str) -> dict[tuple[str, str], str]:
    return {
        ("unsloth", "config:delta"): unsloth + silent + """\
logp = torch.tensor([[-1.0 + float(torch.log(torch.tensor(1.15)))]], requires_grad=True)  # ratio 1.15
keys = {"loss_type": "dapo", "importance_sampling_level": "token", "use_bias_correction_kl": True,
        "num_processes": 1, "use_vllm": False, "epsilon_low": 0.2, "epsilon_high": 0.2, "delta": 1.1,
        "current_gradient_accumulation_steps": 1, "steps_per_generation": 1,
        "num_items_in_batch": torch.tensor(1.0)}
ids = torch.zeros((1, 1), dtype=torch.long)
loss = rl.grpo_compute_loss(None, logp, torch.tensor([[-1.0]]), None, ids, torch.ones_like(ids), 0.0,
                            torch.tensor([1.0]), **keys)[0]
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("Unsloth grpo_compute_loss(delta=1.1, epsilon_high=0.2) (rl_replacements.py:1159): accepted; "
        "d loss / d logp of an A > 0 token inside the clip band (ratio 1.15), loss_type dapo",
        f"{grad} (delta caps the ratio inside the band)", "-1.15 (-A r: the band [0.8, 1.2] is open)",
        grad == 0.0)
""",
        ("unsloth", "completion_mask_pad_eos"): unsloth + """\
# grpo_accumulated_loss's text path (rl_replacements.py:2962-2975) on one row: a left pad, the prompt
# (3, 4), the completion (5, 6, EOS) and a right pad, with the tokenizer's pad id equal to its EOS id
pad = eos = 0
input_ids = torch.tensor([[pad, 3, 4, 5, 6, eos, pad]])
logits_to_keep = 4  # the completion's width: 5, 6, EOS, pad
left_pad_tokens_per_prompt = rl.calculate_pad_tokens_in_prompt(input_ids, logits_to_keep, pad)
max_left_pad = int(torch.max(left_pad_tokens_per_prompt))  # no old / ref log-probs: :2970
input_ids = rl.left_pack_padding(input_ids, pad)
completion_input_ids = input_ids[:, -(logits_to_keep + max_left_pad):]
mask = rl.create_completion_attention_mask(completion_input_ids, left_pad_tokens_per_prompt, max_left_pad,
                                          pad)
kept = int(mask.sum())
verdict("Unsloth grpo_accumulated_loss's loss mask (rl_replacements.py:2975, "
        "create_completion_attention_mask :719 ids != pad_token_id) of the completion 5, 6, EOS with "
        "pad id == EOS id: the completion tokens in the loss", f"{kept} (mask {mask.int().tolist()})",
        "3 (TRL's completion_mask keeps the EOS token)", kept == 2)
""",
        ("unsloth", "config:max_completion_length"): unsloth + silent + """\
# dr_grpo on one row of 4 completion tokens, on-policy (ratio 1), A = 1, with max_completion_length 2:
# the response is longer than the L_max the loss divides by (policy_losses.md eq. (11): an error)
logp = torch.zeros((1, 4), dtype=torch.float64, requires_grad=True)
keys = {"loss_type": "dr_grpo", "importance_sampling_level": "token", "use_bias_correction_kl": True,
        "num_processes": 1, "use_vllm": False, "epsilon_low": 0.2, "epsilon_high": 0.2,
        "current_gradient_accumulation_steps": 1, "max_completion_length": 2}
ids = torch.zeros((1, 4), dtype=torch.long)
loss = rl.grpo_compute_loss(None, logp, logp.detach(), None, ids, torch.ones_like(ids), 0.0,
                            torch.tensor([1.0], dtype=torch.float64), **keys)[0].item()  # accepted
verdict("Unsloth grpo_compute_loss(loss_type='dr_grpo', max_completion_length=2) (rl_replacements.py:1231) "
        "on a response of 4 tokens: accepted; the loss", f"{loss} (-4 / (1 x 2): no error, no warning)",
        "an error: the response is longer than max_completion_length, the L_max of Dr. GRPO's denominator",
        loss == -2.0)
""",
    }
