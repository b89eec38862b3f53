"""OpenRLHF's standalone reproductions beyond repro_bodies.py's first ones: ``openrlhf_bodies(silent)``
returns them keyed as ``BODIES``, given repro_bodies.py's warnings-as-errors preamble."""

from __future__ import annotations

__all__ = ["openrlhf_bodies"]


def openrlhf_bodies(silent: str) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("openrlhf", "config:is_correction_mode"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
old = torch.tensor([[-1.0]])  # old = new: the policy ratio is 1
logp = torch.tensor([[-1.0]], requires_grad=True)
rollout = torch.tensor([[-4.0]])  # pi_train / pi_rollout = e^3 = 20.1, outside the band [0.5, 5]
adv, mask = torch.tensor([[1.0]]), torch.ones(1, 1)
loss = {}
for kind in ("gspo", "ppo"):  # the same correction settings, accepted by both
    policy_loss = loss_module.PolicyLoss(policy_loss_type=kind, is_correction_level="token",
                                         is_correction_mode="mask", is_correction_threshold=(0.5, 5.0))
    loss[kind] = policy_loss(logp, old, adv, action_mask=mask, rollout_log_probs=rollout)[0].item()
verdict("OpenRLHF PolicyLoss(policy_loss_type='gspo', is_correction_level='token', "
        "is_correction_mode='mask', threshold (0.5, 5)) (models/loss.py:216: the correction runs for 'ppo' "
        "only): accepted; the loss of "
        "a token whose weight pi_train / pi_rollout = e^3 is outside the band",
        f"{loss['gspo']} (the token kept: GSPO's ratio against the rollout, clipped)",
        f"{loss['ppo']} (the token masked, as policy_loss_type 'ppo' does with these settings)",
        loss["ppo"] == 0.0 and loss["gspo"] != 0.0)
""",
    }
