"""OpenRLHF's standalone reproductions of the sweep of its CLI options (validation findings):
``openrlhf_sweep_bodies(silent)`` returns them keyed as ``BODIES``, given repro_bodies.py's
warnings-as-errors preamble."""

from __future__ import annotations

from .repro_openrlhf import _experience_method

__all__ = ["openrlhf_sweep_bodies"]

_LOSS = """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
"""

_PENALTY = """\
bare_packages("openrlhf", "utils", "trainer", "trainer.ppo_utils")
penalty = importlib.import_module("openrlhf.trainer.ppo_utils.length_penalty")
"""


def openrlhf_sweep_bodies(silent: str) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("openrlhf", "config:clip_range"): _LOSS + """\
utils = load_file("openrlhf", "models/utils.py")
""" + silent + """\
scores = torch.tensor([1.0, -1.0, 0.0])  # three responses' scores
out = utils.compute_reward(scores, 0.0, torch.zeros(3, 1), action_mask=torch.ones(3, 1),
                           reward_clip_range=(5.0, -5.0))  # --reward.clip_range 5 -5: LOW > HIGH, accepted
verdict("OpenRLHF compute_reward (models/utils.py:142) with --reward.clip_range 5 -5 (LOW > HIGH, not "
        "checked): the rewards of scores 1, -1, 0", out.reshape(-1).tolist(),
        "[1.0, -1.0, 0.0] (or an error: an empty clip range)", out.reshape(-1).tolist() == [-5.0] * 3)
""",
        ("openrlhf", "config:gamma"): (_experience_method("get_advantages_and_returns", "gae") + silent + """\
mask = torch.ones(1, 3)
values = torch.zeros(1, 3)
rewards = torch.tensor([[0.0, 0.0, 1.0]])  # reward 1 on the last token, V = 0
advantages, _ = gae(None, values, rewards, mask, 1.5, 1.0)  # --algo.advantage.gamma 1.5: accepted
verdict("OpenRLHF get_advantages_and_returns (trainer/ppo_utils/experience_maker.py:382) with "
        "--algo.advantage.gamma 1.5 (not checked): A_0 of reward 1 two tokens later", advantages[0, 0].item(),
        "an error (a discount lies in [0, 1]; the return of reward 1 is at most 1)",
        advantages[0, 0].item() > 2.0)
"""),
        ("openrlhf", "config:kl_target"): """\
controllers = load_file("openrlhf", "trainer/ppo_utils/kl_controller.py")
""" + silent + """\
ctl = controllers.AdaptiveKLController(0.1, -0.5, 10000)  # --algo.kl.target -0.5: accepted
ctl.update(2.0, 1000)  # the KL (2) is far above any target: the coefficient should grow
verdict("OpenRLHF AdaptiveKLController (trainer/ppo_utils/kl_controller.py:17) with --algo.kl.target -0.5 "
        "(not checked): the KL coefficient 0.1 after one update with KL 2.0, n_steps 1000",
        ctl.value, "an error (a KL target is > 0), or a coefficient > 0.1", ctl.value < 0.1)
""",
        ("openrlhf", "config:overlong_buffer_len"): _PENALTY + silent + """\
ns = types.SimpleNamespace
args = ns(reward=ns(overlong_buffer_len=0.0, overlong_penalty_factor=1.0, stop_properly_penalty_coef=None),
          rollout=ns(max_new_tokens=100), data=ns(max_len=2048))  # --reward.overlong_buffer_len 0: accepted
experience = ns(rewards=torch.tensor([1.0]), response_length=torch.tensor([100]), truncated=None, info={})
penalty.apply_length_penalties([experience], args)
verdict("OpenRLHF apply_overlong_penalty (trainer/ppo_utils/length_penalty.py:51) with "
        "--reward.overlong_buffer_len 0 (not checked): the reward 1.0 of a response at the limit of 100 "
        "tokens",
        experience.rewards.tolist(), "an error (L_cache > 0 in eq. (8)), or the full penalty: [0.0]",
        experience.rewards.item() == 1.0)
""",
        ("openrlhf", "config:overlong_penalty_factor"): _PENALTY + silent + """\
ns = types.SimpleNamespace
args = ns(reward=ns(overlong_buffer_len=20.0, overlong_penalty_factor=-1.0, stop_properly_penalty_coef=None),
          rollout=ns(max_new_tokens=100), data=ns(max_len=2048))  # factor -1: accepted
experience = ns(rewards=torch.tensor([0.0, 0.0]), response_length=torch.tensor([50, 100]), truncated=None,
                info={})
penalty.apply_length_penalties([experience], args)
verdict("OpenRLHF apply_overlong_penalty (trainer/ppo_utils/length_penalty.py:54) with "
        "--reward.overlong_penalty_factor -1 (not checked): the rewards 0 of responses of 50 and 100 tokens "
        "(limit 100, buffer 20)", experience.rewards.tolist(),
        "an error, or [0.0, -1.0] (a penalty: the overlong response gets less)",
        experience.rewards[1].item() > 0)
""",
        ("openrlhf", "config:stop_properly_penalty_coef"): _PENALTY + silent + """\
ns = types.SimpleNamespace
args = ns(reward=ns(overlong_buffer_len=None, overlong_penalty_factor=1.0, stop_properly_penalty_coef=0.5),
          rollout=ns(max_new_tokens=100), data=ns(max_len=2048))  # coefficient 0.5, in its [0, 1]
# two wrong answers (reward -1): the first stopped properly, the second was truncated
experience = ns(rewards=torch.tensor([-1.0, -1.0]), response_length=torch.tensor([40, 100]),
                truncated=torch.tensor([False, True]), info={})
penalty.apply_length_penalties([experience], args)
verdict("OpenRLHF apply_stop_properly_penalty (trainer/ppo_utils/length_penalty.py:103) with "
        "--reward.stop_properly_penalty_coef 0.5: rewards -1 of a stopped and a truncated response",
        experience.rewards.tolist(), "the truncated response's reward <= -1 (a penalty), e.g. [-1.0, -1.5]",
        experience.rewards[1].item() > experience.rewards[0].item())
""",
        ("openrlhf", "config:value_clip"): _LOSS + """\
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
old = torch.tensor([[0.0]])
values = torch.tensor([[0.5]], requires_grad=True)  # the critic has moved half-way to the return 1
returns, mask = torch.tensor([[1.0]]), torch.ones(1, 1)
loss = loss_module.ValueLoss(0.0)(values, old, returns, action_mask=mask)  # --critic.value_clip 0: accepted
loss.backward()
verdict("OpenRLHF ValueLoss(clip_eps=0.0) (models/loss.py:283, --critic.value_clip 0, not checked): the "
        "gradient of V = 0.5 (V_old 0, return 1)", values.grad.item(),
        "an error, or -0.5 (the unclipped value loss 0.5 (V - R)^2)", values.grad.item() == 0.0)
""",
        ("openrlhf", "config:async_enable"): _LOSS + """\
loss_module = load_file("openrlhf", "models/loss.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
checks = (root / "cli/train_ppo_ray.py").read_text().split("args = hierarchize(args)", 1)[1]
checked = "is_correction_level" in checks  # the launcher's checks after parsing
""" + silent + """\
logp = torch.tensor([[-2.0]], requires_grad=True)  # pi_theta = pi_old (first mini-batch)
old = torch.tensor([[-2.0]])
behaviour = torch.tensor([[-1.0]])  # the stale sampler gave the token e times pi_old's probability
adv, mask = torch.tensor([[1.0]]), torch.ones(1, 1)
loss = loss_module.PolicyLoss()(logp, old, adv, action_mask=mask, rollout_log_probs=behaviour)[0].item()
exact = -torch.exp(old - behaviour).item()  # eq. (13): w = pi_old / pi_behaviour times r A at r = 1
verdict("OpenRLHF with --train.async_enable and --algo.advantage.is_correction_level off (the default; "
        f"cli/train_ppo_ray.py:714, the checks read is_correction_level: {checked}): the loss of a token "
        "sampled by a stale policy with e times pi_old's probability, A = 1", loss,
        f"{exact:.4f} (decoupled PPO, the behaviour weight pi_old / pi_behaviour)",
        not checked and abs(loss - exact) > 0.5)
""",
        ("openrlhf", "config:normalize_enable"): """\
import asyncio  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

stand_ins("aiohttp")
root = bare_packages("openrlhf", "utils")
agent = importlib.import_module("openrlhf.utils.agent")
readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "normalize_enable" in p.read_text())
""" + silent + """\
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:  # a remote reward function
    f.write("import torch\\ndef reward_func(queries, prompts, labels):\\n    return {'rewards': 5.0}\\n")


class Engine:  # a vLLM stand-in
    async def generate(self, tokens, params, multi_modal_data=None):
        out = types.SimpleNamespace(token_ids=[7, 7], text="a", finish_reason="stop", logprobs=None)
        return types.SimpleNamespace(outputs=[out])


class Tokenizer:
    def __call__(self, text, add_special_tokens=False, return_tensors="pt"):
        return {"input_ids": torch.ones(1, 3, dtype=torch.long)}

    def decode(self, tokens, skip_special_tokens=False):
        return "query"


params = types.SimpleNamespace(max_tokens=4, logprobs=None)
out = asyncio.run(agent.SingleTurnAgentExecutor(f.name).execute(
    "p", None, params, max_length=100, hf_tokenizer=Tokenizer(), llm_engine=Engine()))
os.unlink(f.name)
verdict("OpenRLHF --reward.normalize_enable with --reward.remote_url (utils/agent.py's reward path; the "
        f"files that read the option: {readers}): the training reward of a remote reward of 5.0",
        out["reward"], "the normalised reward, or an error that the option does not apply",
        out["reward"] == 5.0 and not any(r.startswith("utils/agent") for r in readers))
""",
        ("openrlhf", "config:top_p"): _LOSS + """\
loss_module = load_file("openrlhf", "models/loss.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
actor_reads_top_p = "top_p" in (root / "models/actor.py").read_text()  # it applies the temperature only
""" + silent + """\
logits = torch.tensor([2.0, 1.0, 0.0, -1.0], requires_grad=True)  # one position's policy
pi = torch.softmax(logits.detach(), -1)
q = torch.where(pi.cumsum(-1) - pi < 0.8, pi, 0.0)  # vLLM's nucleus (--rollout.top_p 0.8)
q = q / q.sum()
logp = torch.log_softmax(logits, -1).unsqueeze(-1)  # each token as a one-token response, pi_old = pi
# the expected loss over the sampler's draws: each token's PolicyLoss (A = 1) weighed by its probability q
terms = torch.stack([loss_module.PolicyLoss()(logp[k:k + 1], logp[k:k + 1].detach(), torch.ones(1, 1),
                                              action_mask=torch.ones(1, 1))[0] for k in range(4)])
grad = torch.autograd.grad((q * terms).sum(), logits)[0]
verdict("OpenRLHF with --rollout.top_p 0.8 and --algo.advantage.is_correction_level off (models/actor.py "
        f"reads top_p: {actor_reads_top_p}): the expected policy-gradient of a constant advantage 1 over "
        "nucleus samples, d loss / d logits", [round(g, 4) for g in grad.tolist()],
        "[0.0, 0.0, 0.0, 0.0] (E_pi[grad log pi] = 0: a constant advantage moves nothing)",
        not actor_reads_top_p and grad.abs().max().item() > 0.05)
""",
        ("openrlhf", "config:micro_batch_size"): """\
import ast  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
source = (root / "trainer/ray/ppo_actor.py").read_text()
call = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
            and getattr(n.func, "id", "") == "DataLoader")  # ppo_train's loader over the replay buffer
drop_last = next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "drop_last")
""" + silent + """\
samples = list(range(5))  # one rank's replay buffer: 5 experiences (each counted in the whitening)
loader = torch.utils.data.DataLoader(samples, batch_size=2, shuffle=False, drop_last=drop_last,
                                     collate_fn=lambda batch: batch)  # --train.micro_batch_size 2
trained = [i for batch in loader for i in batch]
verdict("OpenRLHF ActorPPOTrainer.ppo_train (trainer/ray/ppo_actor.py:167, drop_last="
        f"{drop_last}) with 5 experiences on a rank and --train.micro_batch_size 2: the experiences "
        "trained in an epoch", trained, "[0, 1, 2, 3, 4] (every sample of the rollout)", len(trained) < 5)
""",
        ("openrlhf", "config:max_new_tokens"): """\
import asyncio  # noqa: E402

stand_ins("aiohttp")
bare_packages("openrlhf", "utils")
agent = importlib.import_module("openrlhf.utils.agent")
""" + silent + """\
budgets = []


class Engine:  # a vLLM stand-in: generates as many tokens as it may
    async def generate(self, tokens, params, multi_modal_data=None):
        budgets.append(params.max_tokens)
        out = types.SimpleNamespace(token_ids=[7] * params.max_tokens, text="a", finish_reason="length",
                                    logprobs=None)
        return types.SimpleNamespace(outputs=[out])


class Env(agent.AgentInstanceBase):  # one turn: done after the first action
    def __init__(self, *args, **kwargs):
        pass

    async def reset(self, states, **kwargs):
        return {"observation": states["observation"]}

    async def step(self, states, **kwargs):
        return {"rewards": torch.tensor(1.0), "environment_feedback": "", "done": True}


def tokenizer(text, add_special_tokens=False, return_tensors="pt"):
    return {"input_ids": torch.ones(1, len(text.split()), dtype=torch.long)}


params = types.SimpleNamespace(max_tokens=16, logprobs=None)  # --rollout.max_new_tokens 16
result = asyncio.run(agent.MultiTurnAgentExecutor(Env).execute(
    "p " * 10, None, params, max_length=1000, hf_tokenizer=tokenizer, llm_engine=Engine()))
generated = sum(end - start for start, end in result["action_ranges"])
verdict("OpenRLHF MultiTurnAgentExecutor.execute (utils/agent.py:94) with --rollout.max_new_tokens 16, "
        "--data.max_len 1000, a 10-token prompt: the generation budget and the tokens generated",
        f"{budgets}, {generated}", "[16], 16 (the response budget the option sets)", generated > 16)
""",
        ("openrlhf", "config:loss_agg_mode"): _LOSS + """\
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
# --actor.loss_agg_mode token-mean (the default: token_level_loss=True) with --actor.policy_loss_type gspo
policy = loss_module.PolicyLoss(token_level_loss=True, policy_loss_type="gspo")  # accepted silently
logp = torch.zeros(2, 3, requires_grad=True)
old = torch.tensor([[-0.1, 0.0, 0.0], [-0.1, -0.1, -0.1]])  # a 1-token and a 3-token response, ratio e^0.1
adv, mask = torch.tensor([[1.0] * 3, [-1.0] * 3]), torch.tensor([[1, 0, 0], [1, 1, 1]])
loss = policy(logp, old, adv, action_mask=mask)[0]
verdict("OpenRLHF PolicyLoss(token_level_loss=True, policy_loss_type='gspo') (models/loss.py:152): accepted; "
        "its aggregation and the loss of a 1-token (A = 1) and a 3-token (A = -1) response, ratio e^0.1 "
        "(eps 0.2: unclipped)", f"token_level_loss={policy.token_level_loss}, loss {loss.item():.6f}",
        f"token_level_loss=True (the setting given), loss {(-torch.e ** 0.1 + 3 * torch.e ** 0.1) / 4:.6f} "
        "(each token weighs 1/4), or an error", policy.token_level_loss is False)
""",
        ("openrlhf", "kl_mean_empty_row"): _LOSS + """\
utils = load_file("openrlhf", "models/utils.py")
controller = load_file("openrlhf", "trainer/ppo_utils/kl_controller.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
line = (root / "trainer/ppo_utils/experience_maker.py").read_text().splitlines()[214].strip()
assert line == "kl_mean = masked_mean(kl, samples.action_mask, dim=-1)", line  # line 215
""" + silent + """\
kl = torch.tensor([[0.0, 0.0], [0.1, 0.1]])  # per-token KL of an empty response and a 2-token one
mask = torch.tensor([[0, 0], [1, 1]])  # the first response has no action token
kl_mean = utils.masked_mean(kl, mask, dim=-1)  # info["kl"], experience_maker.py:215
status_kl = kl_mean.float().mean().item()  # ppo_train's sample-weighted mean (ppo_actor.py:207-219)
ctl = controller.AdaptiveKLController(0.01, 0.1, 10000)  # --algo.kl.target 0.1
ctl.update(status_kl, 2)  # ppo_trainer.py:253
reward = utils.compute_reward(torch.tensor([1.0, 0.0]), ctl.value, kl, action_mask=mask)
verdict("OpenRLHF make_experience's per-response KL (trainer/ppo_utils/experience_maker.py:215) with one "
        "empty response, then AdaptiveKLController.update (target 0.1) and compute_reward: the logged kl, "
        "the KL coefficient and the next rewards", f"{kl_mean.tolist()}, {ctl.value}, {reward.tolist()}",
        "a finite kl (the empty row contributes 0, not counted: 0.1), a finite coefficient (0.01 at "
        "KL = target), finite rewards", bool(torch.isnan(reward).all()))
""",
    }
