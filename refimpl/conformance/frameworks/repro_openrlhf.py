"""OpenRLHF's standalone reproductions beyond repro_bodies.py's first ones: ``openrlhf_bodies(silent)``
returns them keyed as ``BODIES``, given repro_bodies.py's warnings-as-errors preamble."""

from __future__ import annotations

__all__ = ["openrlhf_bodies"]


def _experience_method(name: str, var: str) -> str:
    """Script text binding ``var`` to the method ``name`` of trainer/ppo_utils/experience_maker.py, its
    code as installed (parsed with ast: the module imports ray; ``source`` holds the file's text)."""
    return f"""\
import ast  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
path = root / "trainer/ppo_utils/experience_maker.py"
source = path.read_text()
node = next(n for c in ast.parse(source).body if isinstance(c, ast.ClassDef) for n in c.body
            if isinstance(n, ast.FunctionDef) and n.name == "{name}")
node.decorator_list = []  # @torch.no_grad() only
space = {{"torch": torch, "Tuple": tuple}}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), space)
{var} = space["{name}"]
"""


def _generator_method() -> str:
    """Script text binding ``process`` to ``SamplesGenerator._process_response_into_experience`` as
    installed (parsed with ast: samples_generator.py imports vllm and ray), with ``Experience`` a
    namespace of the fields it is given."""
    return """\
import ast  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
path = root / "trainer/ppo_utils/samples_generator.py"
node = next(n for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef) for n in c.body
            if isinstance(n, ast.FunctionDef) and n.name == "_process_response_into_experience")
space = {"torch": torch, "Experience": lambda **fields: types.SimpleNamespace(**fields)}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), space)
process = space["_process_response_into_experience"]
"""


def _advantages_method() -> str:
    """Script text binding ``advantages_of(experiences, args, kl_coef, estimator)`` to the installed
    ``RemoteExperienceMaker.compute_advantages_and_returns`` (with its ``get_cumulative_returns``), the
    length penalties off (``apply_length_penalties`` is a no-op here: no penalty option is set)."""
    return (_experience_method("get_cumulative_returns", "returns_of") + """\
import itertools  # noqa: E402

stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
node = next(n for c in ast.parse(source).body if isinstance(c, ast.ClassDef) for n in c.body
            if isinstance(n, ast.FunctionDef) and n.name == "compute_advantages_and_returns")
node.decorator_list = []  # @torch.no_grad() only
quiet = types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
space = {"torch": torch, "itertools": itertools, "List": list, "Experience": object, "logger": quiet,
         "compute_reward": utils.compute_reward, "masked_mean": utils.masked_mean,
         "apply_length_penalties": lambda experiences, args: None}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), space)


def advantages_of(experiences, args, kl_coef, estimator):
    maker = types.SimpleNamespace(strategy=types.SimpleNamespace(args=args), advantage_estimator=estimator,
                                  kl_ctl=types.SimpleNamespace(value=kl_coef),
                                  get_cumulative_returns=lambda r, m, g: returns_of(None, r, m, g))
    return space["compute_advantages_and_returns"](maker, experiences)
""")


def openrlhf_bodies(silent: str) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("openrlhf", "constant_group_rounding"): """\
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
source = (root / "trainer/ppo_utils/experience_maker.py").read_text().splitlines()
line = source[273].strip()  # line 274: group_norm, inline in compute_advantages_and_returns
assert line.startswith("rewards = (rewards - rewards.mean("), line
rewards = torch.tensor([[0.1] * 8])  # one prompt's 8 equal rewards, float32 as torch.tensor makes them
advantages = eval(line.split("=", 1)[1], {"rewards": rewards})  # the installed expression itself
verdict("OpenRLHF group_norm (trainer/ppo_utils/experience_maker.py:274) on a group of eight equal "
        "float32 rewards 0.1: the advantages", advantages.tolist(), "[0.0] * 8 (no signal in the group)",
        bool(advantages.abs().min() > 0.5))
""",
        ("openrlhf", "overlong_max_len"): """\
bare_packages("openrlhf", "utils", "trainer", "trainer.ppo_utils")
penalty = importlib.import_module("openrlhf.trainer.ppo_utils.length_penalty")
""" + silent + """\
ns = types.SimpleNamespace
args = ns(reward=ns(overlong_buffer_len=512, overlong_penalty_factor=1.0, stop_properly_penalty_coef=None),
          rollout=ns(max_new_tokens=None), data=ns(max_len=2048))  # the defaults but the buffer
# a 600-token prompt: the response limit is 2048 - 600 = 1448 (cli/train_ppo_ray.py:403); truncated there
experience = ns(rewards=torch.tensor([1.0]), response_length=torch.tensor([1448]), truncated=None, info={})
penalty.apply_length_penalties([experience], args)
verdict("OpenRLHF apply_length_penalties (trainer/ppo_utils/length_penalty.py:127), max_new_tokens None, "
        "max_len 2048, buffer 512: the reward of a response truncated at its limit of 1448 tokens",
        experience.rewards.tolist(), "[0.0] (1.0 - 1: DAPO's full penalty at the response limit)",
        experience.rewards.item() == 1.0)
""",
        ("openrlhf", "kl_value_clamp"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
""" + silent + """\
logp = torch.tensor([[-4.0]], requires_grad=True)
ref = torch.tensor([[-1.0]])  # log(pi / ref) = -3: k3 = e^3 - 1 - 3 = 16.09
kl = utils.compute_approx_kl(logp, ref, kl_estimator="k3")  # the KL loss's per-token term (use_loss)
kl.sum().backward()
verdict("OpenRLHF compute_approx_kl(k3) (models/utils.py:113) at log(pi / ref) = -3: value and gradient",
        f"{kl.item()}, {logp.grad.item()}", f"{torch.e ** 3 - 4:.4f}, {1 - torch.e ** 3:.4f}",
        logp.grad.item() == 0.0)
""",
        ("openrlhf", "kl_reward_value_clamp"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
""" + silent + """\
logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-13.0]])  # log(pi / ref) = 12
kl = utils.compute_approx_kl(logp, ref, kl_estimator="k1")  # the default estimator
reward = utils.compute_reward(torch.tensor([0.0]), 0.1, kl, action_mask=torch.ones(1, 1))
verdict("OpenRLHF compute_reward(kl_coef=0.1) of compute_approx_kl(k1) (models/utils.py:113) at "
        "log(pi / ref) = 12: the KL reward", reward.tolist(), "[[-1.2]] (-0.1 * 12)",
        abs(reward.item() + 1.0) < 1e-6)
""",
        ("openrlhf", "config:dual_clip"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
old = torch.tensor([[0.0]])
logp = torch.tensor([[0.1]], requires_grad=True)  # ratio e^0.1 = 1.105, inside [0.8, 1.2]
adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
loss = loss_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=1.1)(
    logp, old, adv, action_mask=mask)[0]  # accepted: dual_clip 1.1 is inside the clip band
loss.backward()
verdict("OpenRLHF PolicyLoss(eps 0.2, dual_clip=1.1) (models/loss.py:156): accepted; the loss and gradient "
        "of a token with ratio 1.105 and A = -1", f"{loss.item()}, {logp.grad.item()}",
        f"{torch.e ** 0.1:.4f}, {torch.e ** 0.1:.4f} (PPO's unclipped term)", logp.grad.item() == 0.0)
""",
        ("openrlhf", "entropy_aggregation"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
call = (root / "trainer/ray/ppo_actor.py").read_text().splitlines()[346:351]  # lines 347-351
assert "token_level_loss" not in "".join(call), call  # the entropy's call: aggregate_loss's default
""" + silent + """\
entropy = torch.tensor([[1.0, 0.0, 0.0], [4.0, 4.0, 4.0]])  # a 1-token and a 3-token response
mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
info = {"dp_size": 1, "batch_num_tokens": torch.tensor(4.0), "global_batch_size": torch.tensor(2.0)}
got = loss_module.aggregate_loss(entropy, mask, **info).item()  # ppo_actor.py:347's call
seq = loss_module.aggregate_loss(entropy, mask, token_level_loss=False, **info).item()  # seq-mean-token-mean
verdict("OpenRLHF's entropy term (trainer/ray/ppo_actor.py:347: aggregate_loss without token_level_loss) "
        "under --actor.loss_agg_mode seq-mean-token-mean: responses of 1 and 3 tokens, entropies 1 and 4",
        f"{got} (the token mean)", f"{seq} (the sequence mean of token means, as the policy term)",
        abs(got - seq) > 0.1)
""",
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
        ("openrlhf", "reward_clip_range"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
""" + silent + """\
rewards = torch.tensor([[8.0, -8.0]])  # one prompt, two responses, inside the reward clip (-10, 10)
baseline = (rewards.sum(-1, keepdim=True) - rewards) / 1  # rloo, experience_maker.py:269
shaped = (rewards - baseline).reshape(-1)  # the value compute_reward receives as `r` (line 284)
out = utils.compute_reward(shaped, 0.0, torch.zeros(2, 1), action_mask=torch.ones(2, 1),
                           reward_clip_range=(-10.0, 10.0))  # --reward.clip_range's default
verdict("OpenRLHF compute_reward (models/utils.py:142) with the default --reward.clip_range (-10, 10) after "
        "rloo: rewards 8 and -8 (inside the clip) in a group of 2, the advantages", out.reshape(-1).tolist(),
        "[16.0, -16.0] (advantages.md eq. (2); the rewards need no clip)",
        out.abs().max().item() == 10.0)
""",
        ("openrlhf", "gae_interior_mask"): (_experience_method("get_advantages_and_returns", "gae")
                                            + silent + """\
mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # action, two observation tokens, action (multi-turn)
values = torch.tensor([[0.5, 9.0, 9.0, 0.5]])  # the critic's values (those at observations are masked)
rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
gamma, lam = 0.9, 0.95
advantages, _ = gae(None, values, rewards, mask, gamma, lam)
exact = (gamma * 0.5 - 0.5) + gamma * lam * (1.0 - 0.5)  # over the actions: delta_0 + gamma lam delta_1
verdict("OpenRLHF get_advantages_and_returns (trainer/ppo_utils/experience_maker.py:377) on a two-turn "
        "response (action, 2 observation tokens, action), gamma 0.9, lambd 0.95: A_0",
        advantages[0, 0].item(), exact, abs(advantages[0, 0].item() - exact) > 0.1)
"""),
        ("openrlhf", "config:eps_clip"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
logp = torch.tensor([[-1.0]], requires_grad=True)  # on-policy: ratio 1
loss = loss_module.PolicyLoss(clip_eps_low=-0.1, clip_eps_high=-0.1)(
    logp, torch.tensor([[-1.0]]), torch.tensor([[1.0]]), action_mask=torch.ones(1, 1))[0]  # accepted
loss.backward()
verdict("OpenRLHF PolicyLoss(clip_eps_low=-0.1, clip_eps_high=-0.1) (models/loss.py:201): accepted; the "
        "gradient of an on-policy token with A = 1", logp.grad.item(),
        "-1.0 (ratio 1 lies inside every valid band, 0 <= eps < 1)", logp.grad.item() == 0.0)
""",
        ("openrlhf", "config:is_correction_threshold"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
logp = torch.tensor([[-1.0]], requires_grad=True)
old = rollout = torch.tensor([[-1.0]])  # on-policy, no train/rollout mismatch: the weight is 1
policy_loss = loss_module.PolicyLoss(is_correction_level="token", is_correction_mode="mask",
                                     is_correction_threshold=(5.0, 0.5))  # LOW > HIGH: accepted
loss = policy_loss(logp, old, torch.tensor([[1.0]]), action_mask=torch.ones(1, 1),
                   rollout_log_probs=rollout)[0]
loss.backward()
verdict("OpenRLHF PolicyLoss(is_correction_level='token', mode 'mask', threshold (5.0, 0.5)) "
        "(models/loss.py:217): accepted; the loss and gradient of an on-policy token with weight 1 and A = 1",
        f"{loss.item()}, {logp.grad.item()}", "-1.0, -1.0 (a weight of 1 is never out of band)",
        loss.item() == 0.0 and logp.grad.item() == 0.0)
""",
        ("openrlhf", "gspo_rollout_ratio"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
T = 3
old = torch.zeros(1, T, dtype=torch.float64)  # the trainer's log-probs of the sampled tokens
logp = old.clone().requires_grad_(True)  # the first mini-batch of the step: pi_theta = pi_old
rollout = old - 0.01  # the sampler's numerics: 0.01 nats of train/rollout mismatch per token
adv, mask = torch.ones(1, T, dtype=torch.float64), torch.ones(1, T, dtype=torch.float64)
policy_loss = loss_module.PolicyLoss(clip_eps_low=3e-4, clip_eps_high=4e-4, policy_loss_type="gspo",
                                     is_correction_level="token")  # the mask band (0.5, 5) keeps e^0.01
policy_loss(logp, old, adv, action_mask=mask, rollout_log_probs=rollout)[0].backward()
w = torch.exp((old - rollout).mean())  # policy_losses.md eq. (13): the detached weight, outside the gate
exact = (-w * 1.0 / T).item()  # s = 1 inside the band: d(-w s A) / d logp_t = -w A s / T
verdict("OpenRLHF PolicyLoss(policy_loss_type='gspo', is_correction_level='token') (models/loss.py:192: "
        "the sequence ratio against rollout_log_probs), pi_theta = pi_old, a train/rollout mismatch of 0.01 "
        "nats per token, GSPO's eps 3e-4 / 4e-4, A = 1: the gradient per token", logp.grad.tolist(),
        f"{[[exact] * T]} (s = 1, weight e^0.01)", logp.grad.abs().max().item() == 0.0)
""",
        ("openrlhf", "reinforce_gamma"): _experience_method("get_cumulative_returns", "returns_of") + """\
assert source.splitlines()[316].strip() == "experience.advantages = experience.returns.clone()"  # line 317
""" + silent + """\
gamma = 0.5
rewards = torch.tensor([[0.0, 0.0, 1.0]])  # the reward on the last token of a 3-token response
advantages = returns_of(None, rewards, torch.ones(1, 3), gamma)  # estimator reinforce: the returns
exact = [gamma ** t * gamma ** (2 - t) for t in range(3)]  # estimators.md eq. (15): gamma^t G_t
verdict("OpenRLHF estimator reinforce (trainer/ppo_utils/experience_maker.py:317, get_cumulative_returns) "
        "with gamma 0.5, reward 1 on the last of 3 tokens: the advantages before the batch whitening",
        advantages.tolist(), f"{[exact]} (each step's G_t weighted by gamma^t)",
        abs(advantages[0, 0].item() - exact[0]) < 1e-12 and abs(advantages[0, 2].item() - exact[2]) > 0.5)
""",
        ("openrlhf", "config:advantages"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
""" + silent + """\
old = torch.zeros(1, 2, dtype=torch.float64)
logp = (old + torch.log(torch.tensor(1.01, dtype=torch.float64))).requires_grad_(True)  # s = 1.01
adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)  # per token: the sequence's mean advantage is 0
policy_loss = loss_module.PolicyLoss(clip_eps_low=3e-4, clip_eps_high=4e-4, policy_loss_type="gspo")
loss = policy_loss(logp, old, adv, action_mask=torch.ones(1, 2, dtype=torch.float64))[0]  # accepted
loss.backward()
verdict("OpenRLHF PolicyLoss(policy_loss_type='gspo') (models/loss.py:200) with per-token advantages 1 and "
        "-1 (mean 0) and a sequence ratio 1.01 above GSPO's band: accepted; the loss and gradient",
        f"{loss.item()}, {logp.grad.tolist()}",
        "0.0, [[0.0, 0.0]] (GSPO: one advantage per sequence, here 0)",
        abs(loss.item()) > 1e-3 and logp.grad.abs().max().item() > 0.1)
""",
        ("openrlhf", "config:unbiased_gradient"): """\
import ast  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
maker = ast.parse((root / "trainer/ppo_utils/experience_maker.py").read_text())  # it imports ray
call = next(n for n in ast.walk(maker) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
            "compute_approx_kl" and n.lineno == 206)  # make_experience: the KL in the reward
passed = sorted(k.arg for k in call.keywords)
launcher = ast.parse((root / "cli/train_ppo_ray.py").read_text())  # the launcher's checks (line 727)
check = next(n for n in ast.walk(launcher) if isinstance(n, ast.If) and n.lineno == 727)
assert ast.unparse(check.test) == "args.algo.kl.use_loss", ast.unparse(check.test)
""" + silent + """\
ns = types.SimpleNamespace
args = ns(algo=ns(kl=ns(use_loss=False, unbiased_gradient=True, estimator="k1")))  # KL in the reward
printed = []  # what the launcher's checks print (its print() calls, collected)
exec(compile(ast.Module(body=[check], type_ignores=[]), "train_ppo_ray.py", "exec"),
     {"args": args, "print": lambda *a, **k: printed.append(" ".join(map(str, a)))})
verdict("OpenRLHF --algo.kl.unbiased_gradient without --algo.kl.use_loss (the KL in the reward, "
        "trainer/ppo_utils/experience_maker.py:206): the launcher's KL checks (cli/train_ppo_ray.py:727-734) "
        "and the keywords of the KL reward's compute_approx_kl call",
        f"printed {printed}; the call passes {passed} (the flag never reaches it)",
        "an error or a warning: the flag has no effect unless the KL is a loss",
        printed == [] and "unbiased_gradient" not in passed)
""",
        ("openrlhf", "multiturn_response_length"): _generator_method() + silent + """\
response = {"observation_tokens": list(range(100, 120)), "action_ranges": [(4, 7), (17, 20)],
            "reward": 1.0, "scores": 1.0, "rollout_log_probs": None, "prompt": "p", "label": "l"}
# a 4-token prompt, a turn of 3 action tokens, 10 observation tokens, a turn of 3 action tokens
experience = process(None, response, max_len=2048)
generated = sum(end - start for start, end in response["action_ranges"])
verdict("OpenRLHF SamplesGenerator._process_response_into_experience "
        "(trainer/ppo_utils/samples_generator.py:273) on a two-turn agent response, 3 + 3 action tokens "
        "around 10 observation tokens: response_length (read by the DAPO overlong penalty)",
        int(experience.response_length[0]), f"{generated} (the generated tokens)",
        int(experience.response_length[0]) == 16)
""",
        ("openrlhf", "rloo_kl_outside_baseline"): _advantages_method() + silent + """\
ns = types.SimpleNamespace
args = ns(rollout=ns(n_samples_per_prompt=2), reward=ns(clip_range=(-10.0, 10.0)),
          algo=ns(advantage=ns(estimator="rloo", gamma=1.0, lambd=1.0, no_std_norm=False)))
kl = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # the KL estimator per token (the KL in the reward)
experience = ns(rewards=torch.tensor([1.0, 0.0]), index=[0, 1], action_mask=torch.ones(2, 2), kl=kl,
                values=None, info={})
(out,) = advantages_of([experience], args, 0.1, "rloo")  # kl_coef 0.1
regularised = torch.tensor([1.0, 0.0]) - 0.1 * kl.sum(-1)  # RLOO's reward: R - beta KL
exact = regularised - (regularised.sum() - regularised) / 1  # leave-one-out over the group of 2
verdict("OpenRLHF compute_advantages_and_returns, estimator rloo "
        "(trainer/ppo_utils/experience_maker.py:269), "
        "KL in the reward with kl_coef 0.1: scores 1 and 0, summed KL 2 and 0, the first token's advantages",
        out.advantages[:, 0].tolist(), f"{exact.tolist()} (the leave-one-out baseline of R - beta KL)",
        abs(out.advantages[1, 0].item() - exact[1].item()) > 0.1)
""",
        ("openrlhf", "adaptive_kl_per_token"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
control = load_file("openrlhf", "trainer/ppo_utils/kl_controller.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
line = (root / "trainer/ppo_utils/experience_maker.py").read_text().splitlines()[214].strip()
assert line == "kl_mean = masked_mean(kl, samples.action_mask, dim=-1)", line  # line 215: info["kl"]
""" + silent + """\
mask = torch.tensor([[1.0] + [0.0] * 8, [1.0] * 9], dtype=torch.float64)  # responses of 1 and 9 tokens
kl = 0.1 * mask  # 0.1 nats per token
fed = utils.masked_mean(kl, mask, dim=-1).mean().item()  # status["kl"]: the per-response values' mean
sequence_kl = (kl * mask).sum(-1).mean().item()  # Ziegler et al. 2019: the KL of the responses
ours, paper = control.AdaptiveKLController(0.1, 0.5, 10000), control.AdaptiveKLController(0.1, 0.5, 10000)
ours.update(fed, 10000)  # ppo_trainer.py:253 (n_steps = horizon: one full step of the rule)
paper.update(sequence_kl, 10000)
verdict("OpenRLHF AdaptiveKLController (target 0.5) fed status['kl'] "
        "(trainer/ppo_utils/experience_maker.py:215:"
        " each response's per-token mean), responses of 1 and 9 tokens at 0.1 nats per token: the new beta",
        f"{ours.value} (fed {fed})", f"{paper.value} (fed the sequence KL {sequence_kl}: on target)",
        abs(ours.value - paper.value) > 1e-3)
""",
        ("openrlhf", "grad_accum_partial_window"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
loss_utils = load_file("openrlhf", "utils/loss_utils.py")
""" + silent + """\
gas = 4  # DeepSpeed's gradient_accumulation_steps (deepspeed.py:455-456)
calls = [[3, 5, 2, 4, 6, 1], [2, 2, 3, 3, 4, 4]]  # action tokens of the micro-batches of two ppo_train calls
weights = []  # per micro-batch: (tokens, the weight of one token after DeepSpeed's loss / gas)
for tokens in calls:
    masks = [torch.ones(1, t) for t in tokens]
    for mask, info in loss_utils.iter_grad_accum_global_norm(iter(masks), None, gas, lambda m: m):
        per_token = torch.ones_like(mask, requires_grad=True)
        (loss_module.aggregate_loss(per_token, mask, **info) / gas).backward()
        weights.append((mask.shape[1], per_token.grad[0, 0].item()))
# DeepSpeed's engine.step() steps at every gas-th micro-step of its own counter
sums = [round(sum(n * w for n, w in weights[i:i + gas]), 6) for i in range(0, len(weights), gas)]
verdict("OpenRLHF iter_grad_accum_global_norm (utils/loss_utils.py:102, the trailing partial window) under "
        "DeepSpeed's accumulation of gas = 4 micro-batches: two ppo_train calls of 6 micro-batches, the sum "
        "of the token weights of each optimizer step", sums, "[1.0, 1.0, 1.0] (each step one token mean)",
        max(abs(x - 1.0) for x in sums) > 0.1)
""",
        ("openrlhf", "config:no_std_norm"): """\
import ast  # noqa: E402

root = pathlib.Path(next(iter(importlib.util.find_spec("openrlhf").submodule_search_locations)))
source = (root / "trainer/ppo_utils/experience_maker.py").read_text()
method = next(n for c in ast.parse(source).body if isinstance(c, ast.ClassDef) for n in c.body
              if isinstance(n, ast.FunctionDef) and n.name == "compute_advantages_and_returns")
whiten = next(n for n in ast.walk(method) if isinstance(n, ast.If) and n.lineno == 325)
reads = [n.lineno for n in ast.walk(method) if isinstance(n, ast.Attribute) and n.attr == "no_std_norm"]
assert reads and all(whiten.lineno <= r <= whiten.end_lineno for r in reads), reads  # only line 325's branch
assert "group_norm" not in ast.unparse(whiten.test), ast.unparse(whiten.test)
line = source.splitlines()[273].strip()  # line 274: group_norm
assert line.startswith("rewards = (rewards - rewards.mean("), line
""" + silent + """\
rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # one success in a group of 4, no_std_norm set
advantages = eval(line.split("=", 1)[1], {"rewards": rewards})  # the installed expression itself
centred = rewards - rewards.mean(-1, keepdim=True)
verdict("OpenRLHF --algo.advantage.estimator group_norm with --algo.advantage.no_std_norm "
        "(trainer/ppo_utils/experience_maker.py:325: the flag is read in the whitening branch only): "
        "accepted; "
        "the advantages of one success in a group of 4", advantages.tolist(),
        f"{centred.tolist()} (not divided by the std, as the flag says; or an error)",
        abs(advantages[0, 0].item() - 1.5) < 1e-6)
""",
        ("openrlhf", "entropy_neg_inf"): """\
stand_ins("deepspeed")
identity_compile()  # the eager body of compute_entropy (utils.py:215 compiles it; the values are the same)
utils = load_file("openrlhf", "models/utils.py")
""" + silent + """\
logits = torch.tensor([[[0.0, 1.0, float("-inf")]]])  # one position, a token masked out of the vocabulary
entropy = utils.compute_entropy(logits)
p = torch.softmax(torch.tensor([0.0, 1.0]), -1)
exact = -(p * p.log()).sum().item()  # 0 log 0 = 0: the -inf entry drops out
verdict("OpenRLHF compute_entropy (models/utils.py:218) of logits (0, 1, -inf)", entropy.flatten().tolist(),
        f"{exact:.6f}", bool(torch.isnan(entropy).all()))
""",
    }
