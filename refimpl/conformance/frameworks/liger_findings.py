"""What the Liger-Kernel driver (liger.py) found in liger-kernel 0.8.5 beyond its profile's flags
(``FINDINGS``, each with its class and verified line: findings.py), its chunked loss's and its Triton path's,
and what its matrix section says in prose (``NOTES``). Kept apart from liger.py, the driver's modes and
calls. The Triton path (liger_kernel/transformers/grpo_loss.py, ops/grpo_loss.py) is not driven: its kernels
need triton and a GPU (or ``TRITON_INTERPRET=1``), which the CPU CI has not; its findings cite the lines read,
and a bug's script runs its torch reduction (repro_liger.py)."""

from __future__ import annotations

from .findings import Finding, ratio_overflow_finding, zero_rows_finding

__all__ = ["FINDINGS", "NOTES"]

#: What the driver found in Liger's code (the matrix lists them with the modes that show them).
FINDINGS = (
    ratio_overflow_finding("chunked_loss/grpo_loss.py:155", "coef_1 = torch.exp(log_importance_weights)",
                           "liger-kernel 0.8.5"),
    zero_rows_finding("chunked_loss/grpo_loss.py:228", ").sum() / full_attention_mask.shape[0]",
                      "liger-kernel 0.8.5 (grpo, sapo; dr_grpo and luspo likewise)"),
    Finding(
        "config:use_ref_model", "validation",
        "with beta > 0 and use_ref_model=False (the default of the base class) the ref_per_token_logps it "
        "is given are dropped and the policy's own detached log-probs stand in: the KL term is silently "
        "0 in value and gradient.",
        where="chunked_loss/fused_linear_ppo.py:388",
        quote="if use_ref_model and ref_per_token_logps is not None",
        affected="liger-kernel 0.8.5",
    ),
    Finding(
        "config:delta", "validation",
        "delta (INTELLECT-2's cap on the ratio, a dual clip) is checked only for delta > 0: a delta below 1 +"
        " epsilon_high caps ratios inside the clip band (A > 0 tokens lose their gradient before the clip "
        "does), which no dual-clip formulation intends (c >= 1 + eps_high, policy_losses.md eq. (7)). The "
        "Triton path (triton_grpo_loss -> GrpoLossFunction) checks delta only against the loss type "
        "(ops/grpo_loss.py:642) and maps it to delta_val = float(delta), 0.0 for None (:646), which its "
        "kernels read as off (if DELTA != 0.0, :176, :391, :491): delta = 0 is accepted and disables the cap "
        "at the token level, while at the sequence level the forward clamps coef_1 at max=0 in torch "
        "(:728-729, is not None) and the backward kernel, DELTA = 0, does not (the gradient is not the "
        "loss's); a negative delta is accepted too (every ratio capped below 0). Not driven there (triton and"
        " a GPU): the script runs the chunked loss.",
        where="chunked_loss/grpo_loss.py:467", quote="if delta is not None and delta <= 0:",
        affected="liger-kernel 0.8.5 (chunked loss: delta <= 1 + epsilon_high; Triton path, "
        "ops/grpo_loss.py:641-646: any delta, 0 and negative included)",
    ),
    Finding(
        "config:max_completion_length", "validation",
        "dr_grpo divides by rows x max_completion_length without checking the completions: responses "
        "longer than max_completion_length are accepted and their tokens weigh more than Dr. GRPO's "
        "constant allows (the loss is no longer a mean).",
        where="chunked_loss/grpo_loss.py:236",
        quote="loss = (per_token_loss * attention_mask).sum() / (full_attention_mask.shape[0] * max_comp",
        affected="liger-kernel 0.8.5",
    ),
    Finding(
        "config:epsilon_high", "validation",
        "cispo caps the detached weight at epsilon_high itself (the docstring: 'typically larger (e.g. "
        "5.0)'), whose default is the clip losses' 0.2: LigerFusedLinearGRPOLoss(loss_type='cispo') without "
        "epsilon_high caps every weight at 0.2, so an on-policy token's gradient is 0.2 A, and nothing "
        "checks the cap against 1 (TRL's and Unsloth's cispo likewise; CISPO, policy_losses.md eq. (9), "
        "clips at 1 + eps_high).",
        where="chunked_loss/grpo_loss.py:80", quote="upper_bound = epsilon_high",
        affected="liger-kernel 0.8.5 (chunked loss; the Triton path's cispo likewise, ops/grpo_loss.py:185)",
    ),
    Finding(
        "config:epsilon_low", "validation",
        "epsilon_low and epsilon_high are not range-checked (only delta > 0 and the SAPO temperatures are, "
        "grpo_loss.py:463-468): a negative epsilon_low (or epsilon_high) makes the band [1 - epsilon_low, "
        "1 + epsilon_high] exclude ratio 1, so an on-policy A < 0 (A > 0) token gets the clipped constant "
        "and no gradient; epsilon_low >= 1 removes the lower clip without a word.",
        where="chunked_loss/grpo_loss.py:92", quote="lower_bound = 1 - epsilon_low",
        affected="liger-kernel 0.8.5",
    ),
    Finding(
        "config:advantages", "validation",
        "advantages are documented as per sequence, shape (batch_size,) (grpo_loss.py:312), and nothing "
        "checks the shape: per-token advantages [B, T] are accepted and broadcast by advantages.unsqueeze(1),"
        " [B, 1, T], against the chunk's [b, T] ratios, i.e. a [b, b, T] loss in which row i's ratio meets "
        "every row's advantages. With chunk_size=1 (the default) b = 1 and the result is the per-token loss; "
        "with chunk_size > 1 torch.chunk (fused_linear_ppo.py:385) puts several rows in a chunk and each "
        "token's term is summed over the chunk's rows' advantages: the loss and gradient change with "
        "chunk_size (A = [[1, 1, 1], [0, 0, 0]], ratio 1: dapo -0.5 with chunk_size=1, -1.0 with 2, and row "
        "2, A = 0, gets a gradient). The kit's policy cases carry per-sequence advantages [N] (the "
        "fused_linear kind's chunks too), so no mode shows it.",
        where="chunked_loss/grpo_loss.py:199", quote="per_token_loss1 = coef_1 * advantages.unsqueeze(1)",
        affected="liger-kernel 0.8.5 (chunked loss, every loss_type but sapo, whose expand_as, :166, "
        "raises on [B, T]; cispo :160 and the clip metric :256 likewise)",
    ),
    Finding(
        "defaults", "documented_default",
        "LigerFusedLinearGRPOLoss() is loss_type='dapo' (documented: 'Defaults to \"dapo\"') with "
        "beta=0.04 (:423), use_ref_model=True (:425) and epsilon_low = epsilon_high = 0.2 (:427-428): "
        "DAPO's token mean with a k3 KL term and a symmetric clip band, where DAPO (Yu et al. 2025, "
        "arXiv:2503.14476) drops the KL term and clips higher (eps_high 0.28); without reference "
        "log-probs the defaults assert (fused_linear_ppo.py:229). A user who sets beta=0 and "
        "epsilon_high=0.28 gets DAPO's loss (mode dapo).",
        where="chunked_loss/grpo_loss.py:429", quote='loss_type: str = "dapo",',
        affected="liger-kernel 0.8.5 (chunked loss; ppo_loss_fn's defaults, :108-111, likewise)",
    ),
    Finding(
        "triton_defaults", "documented_default",
        "triton_grpo_loss defaults to temperature=0.9 (:16), beta=0.04, eps_low=0.2, eps_high=0.4 and "
        "loss_type='dapo' (:17-21): its log-probs are of the logits divided by 0.9, so unless the old "
        "and reference log-probs were taken at temperature 0.9 too (TRL 1.16.0's GRPOConfig samples at "
        "1.0, grpo_config.py:533) an on-policy token's ratio is not 1; eps_high 0.4 is neither DAPO's "
        "0.28 nor the chunked loss's 0.2 "
        "(finding defaults): the two Liger GRPO entry points disagree by default. Not driven: the kernels "
        "need triton and a GPU.",
        where="transformers/grpo_loss.py:16", quote="temperature=0.9,",
        affected="liger-kernel 0.8.5 (Triton path)",
    ),
    Finding(
        "cispo_clip_ratio", "value_only",
        "cispo's clip-fraction metric counts a token only when its weight is capped and A > 0 (the PPO "
        "rule, is_upper_clipped & (advantages > 0)), but CISPO's cap sg(min(r, epsilon_high)) scales the "
        "gradient of every token above it whatever the sign of A (policy_losses.md eq. (9)): capped A < 0 "
        "tokens are not counted, so the logged clip ratio understates the clipping. The loss and "
        "gradient are right; the kit reads only the loss, not the metrics, so no mode shows it.",
        where="chunked_loss/grpo_loss.py:257", quote="is_upper_clipped & (advantages.unsqueeze(1) > 0)",
        affected="liger-kernel 0.8.5 (chunked loss; the Triton kernel likewise, ops/grpo_loss.py:187)",
        function="ppo_loss_fn",
    ),
    Finding(
        "luspo_token_level", "bug",
        "loss_type='luspo' with importance_sampling_level='token' (the default level): the [B, T] loss "
        "times each row's length is summed over every position, the padding's unmasked, and divided by "
        "B x T, i.e. sum_i (T_i / T) sum_t f_it / B: every position of row i, padding included, weighs "
        "T_i / (B T) where LUSPO's token sum weighs each response token 1 / B, so padding tokens get "
        "gradient (their log-probs come from the hidden states at pad positions). TRL, whose line the "
        "comment says Liger matches, masks before aggregating since huggingface/trl pull request 6654 "
        "(TRL 1.16.0: (per_token_loss * mask).sum(-1).mean()); a KL term (beta > 0) makes the loss "
        "[B, T] at the sequence level too. Not a driven mode: no spec aggregation weighs a token T_i / T "
        "(UNSUPPORTED).",
        where="chunked_loss/grpo_loss.py:245",
        quote="loss = weighted.sum() / (full_attention_mask.shape[0] * weighted.shape[1])",
        affected="liger-kernel 0.8.5 (chunked loss)",
    ),
    Finding(
        "triton_luspo", "bug",
        "the Triton GRPO loss (transformers/grpo_loss.triton_grpo_loss) with loss_type='luspo' reduces "
        "(per_token_loss * T_i).mean() over B x L: its sequence-level kernel writes the sequence term f_i "
        "at each of the T_i tokens, so the loss is sum_i T_i^2 f_i / (B L), not LUSPO's sum_i T_i f_i / B, "
        "which the chunked loss computes (T = (2, 4), L = 4, f = -1: -2.5 against -3); at the token level "
        "sum_i (T_i / L) sum_t f_it / B. The two Liger paths disagree by T_i / L per row. Not driven: the "
        "kernels need triton and a GPU; the script runs the reduction, plain torch, on the CPU.",
        where="ops/grpo_loss.py:597", quote="return (per_token_loss * mask.sum(-1, keepdim=True)).mean()",
        affected="liger-kernel 0.8.5 (Triton path; transformers/grpo_loss.py:179's _reduce_grpo_loss and "
        "the backward, ops/grpo_loss.py:925-928, likewise)",
    ),
    Finding(
        "triton_dr_grpo_width", "documented_default",
        "the Triton GRPO loss's dr_grpo divides by B x L, the padded width of the batch, when "
        "max_completion_length is None (triton_grpo_loss's docstring: 'defaults to sequence length'), "
        "where Dr. GRPO's L_max is a constant (policy_losses.md eq. (11)): the loss scale changes with the "
        "longest response of each call; the chunked loss raises without it (grpo_loss.py:234-235). Not "
        "driven: the kernels need triton and a GPU.",
        where="ops/grpo_loss.py:592",
        quote="max_len = max_completion_length if max_completion_length is not None else L",
        affected="liger-kernel 0.8.5 (Triton path; the backward, ops/grpo_loss.py:921, and "
        "transformers/grpo_loss.py:171 likewise)", function="_reduce_loss",
    ),
)

NOTES = {
    "delta tie": "float32(exp(float32(log 3))) is exactly 3.0 = delta: clamp(coef_1, max=delta) passes "
    "the gradient at the tie (the spec's inclusive gate at the float32 ratio; in float64 the ratio is "
    "just above 3 and the gradient 0): flags compute_dtype 'float32', ratio_dtype 'float32_gate'.",
    "bias-corrected KL gradient": "with use_bias_correction_kl=True the gradient of k3 * r is a "
    "difference of two terms of size exp(ref - old); in float32 it is lost when |ref - logp| is large "
    "(kit case kl_penalty/0, |log r| up to 24): the float32 tolerance bounds it by those terms' size "
    "(tolerance.kl_gradient_slack).",
}
