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
    }
