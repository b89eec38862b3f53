"""The standalone scripts of a sweep's validation findings for AReaL (areal_sweep.SWEEP_FINDINGS) and of a
fourth audit's two findings (the end of areal_findings.AUDIT_FINDINGS), keyed as
repro_bodies.py's ``BODIES``; they reuse repro_areal.py's preambles (functional.py, utils/data.py's two
classes, actor.py's functions and api/cli_args.py's defaults, each run from the installed file), passed
in by repro_areal.py."""

from __future__ import annotations

__all__ = ["sweep_bodies"]

# api/cli_args.py's __post_init__ methods as installed: the attributes each reads (what it can check)
_POST_INIT_READS = """\
cli_tree = ast.parse((root / "api" / "cli_args.py").read_text())


def post_init_reads(cls):
    \"\"\"The attribute names read by ``cls.__post_init__`` in api/cli_args.py (empty if it has none).\"\"\"
    node = next(n for n in cli_tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    inits = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"]
    return {a.attr for init in inits for a in ast.walk(init) if isinstance(a, ast.Attribute)}


checks = set().union(*(post_init_reads(c) for c in ("TrainEngineConfig", "PPOActorConfig", "PPOConfig",
                                                       "BaseExperimentConfig", "PPOCriticConfig")))
"""


def sweep_bodies(_AREAL: str, _AREAL_ACTOR: str, _NORM_CONFIG: str, _SILENT_AREAL: str, _AREAL_LOSS_FN: str
                 ) -> dict[tuple[str, str], str]:
    """The scripts of the sweep's validation findings, given repro_areal.py's preambles: ``_AREAL`` loads
    functional.py, ``_AREAL_ACTOR`` actor.py's functions, ``_NORM_CONFIG`` NormConfig.__post_init__,
    ``_AREAL_LOSS_FN`` grpo_loss_fn; ``_SILENT_AREAL`` makes a warning an error."""
    return {
        ("areal", "config:temperature"): _SILENT_AREAL + _AREAL_ACTOR + _POST_INIT_READS + """\
vocab_path = root / "utils" / "functional" / "vocab_parallel.py"
node = next(n for n in ast.parse(vocab_path.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "_gather_logprobs")
names = {"torch": torch}
exec(compile(ast.Module(body=[node], type_ignores=[]), str(vocab_path), "exec"), names)
actor_t = config_defaults("TrainEngineConfig")["temperature"]  # what the trainer's log-probs use
logits, token = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0])
sampled = torch.log_softmax(logits / 0.7, -1)[0, 0].item()  # the rollout's distribution, temperature 0.7
trained = names["_gather_logprobs"](logits, token, temperature=actor_t)[0].item()
ratio = round(float(torch.exp(torch.tensor(trained - sampled))), 4)
verdict(f"AReaL: gconfig.temperature 0.7, actor.temperature {actor_t} (the default, api/cli_args.py:1099); "
        f"the config checks read 'temperature': {'temperature' in checks}; [log-prob the rollout sampled "
        "with, the trainer's log-prob (vocab_parallel._gather_logprobs), their ratio] for an on-policy token",
        [round(sampled, 4), round(trained, 4), ratio],
        "ratio 1.0 (the trainer's policy is the sampling policy) or an error for the mismatch",
        "temperature" not in checks and abs(ratio - 1.0) > 1e-3)
""",
        ("areal", "config:reward_clip"): _SILENT_AREAL + _AREAL_ACTOR + _POST_INIT_READS + """\
out = compute_advantages(actor(kl_ctl=0.0, reward_clip=-1.0), rollout([(1, 2), (1, 2)], [1.0, 0.0]))
got = [out["advantages"][0, 0].item(), out["advantages"][1, 0].item()]
verdict(f"AReaL PPOActor._compute_advantages with reward_clip -1 (trainer/ppo/actor.py:170; the config "
        f"checks read reward_clip: {'reward_clip' in checks}): the advantages of rewards (1, 0)", got,
        "[1.0, 0.0] or an error (a clip bound must be > 0)",
        "reward_clip" not in checks and got == [-1.0, -1.0])
""",
        ("areal", "config:reward_scaling"): _SILENT_AREAL + _AREAL_ACTOR + _POST_INIT_READS + """\
out = compute_advantages(actor(kl_ctl=0.0, reward_scaling=0.0), rollout([(1, 2), (1, 2)], [1.0, 0.0]))
got = [out["advantages"][0, 0].item(), out["advantages"][1, 0].item()]
verdict(f"AReaL PPOActor._compute_advantages with reward_scaling 0 (trainer/ppo/actor.py:168; the config "
        f"checks read reward_scaling: {'reward_scaling' in checks}): the advantages of rewards (1, 0)", got,
        "[1.0, 0.0] or an error (a scaling of 0 removes the task reward)",
        "reward_scaling" not in checks and got == [0.0, 0.0])
""",
        ("areal", "config:distill_loss_weight"): _SILENT_AREAL + _AREAL_ACTOR + _AREAL + _AREAL_LOSS_FN
        + _POST_INIT_READS + """\
teacher_checks = post_init_reads("TeacherConfig") - {"warn"}  # warnings.warn


def kd_grad(weight):  # pure distillation (rl_loss_weight 0), ratio 1, log pi -2, teacher's log T -0.5
    logp = torch.tensor([[-2.0]], requires_grad=True)
    batch = {"logprobs": logp.detach().clone(), "advantages": torch.zeros(1, 1),
             "loss_mask": torch.ones(1, 1), "prox_logp": logp.detach().clone(),
             "teacher_logp": torch.tensor([[-0.5]]), "rl_loss_weight": 0.0, "distill_loss_weight": weight}
    loss = grpo_loss_fn(logp, torch.zeros(1, 1), batch, eps_clip=0.2, eps_clip_higher=None, c_clip=None)
    return torch.autograd.grad(loss, logp)[0].item()


got = kd_grad(-1.0)
verdict(f"AReaL TeacherConfig(distill_loss_weight=-1) (its __post_init__ reads {sorted(teacher_checks)}); "
        "grpo_loss_fn, pure distillation (trainer/ppo/actor.py:501): d loss / d log pi of a token the "
        "teacher prefers", got, f"{kd_grad(1.0)} with weight 1 (descent raises log pi), or an error",
        "distill_loss_weight" not in teacher_checks and got == 1.5)
""",
        ("areal", "config:norm_eps"): _SILENT_AREAL + _AREAL_ACTOR + _NORM_CONFIG + """\
checked["__post_init__"](SimpleNamespace(mean_level="group", std_level="group", group_size=2, eps=-1.0))
flipped = norm(mean_level="group", std_level="group", group_size=2, eps=-1.0)(torch.tensor([1.0, 0.0]))
flat = norm(mean_level="group", std_level="group", group_size=2, eps=0.0)(torch.tensor([1.0, 1.0]))
got = [[round(v, 4) for v in flipped.tolist()], flat.tolist()]
verdict("AReaL NormConfig(eps=-1) accepted (api/cli_args.py:80-97); Normalization (utils/data.py:1496): "
        "[group (1, 0) with eps -1, group (1, 1) with eps 0]", got,
        "[[0.7071, -0.7071], [0.0, 0.0]] (eps > 0) or an error",
        got[0] == [-1.7071, 1.7071] and all(v != v for v in got[1]))
""",
        ("areal", "config:discount"): _SILENT_AREAL + _AREAL_ACTOR + _POST_INIT_READS + """\
out = compute_advantages(actor(kl_ctl=0.0, discount=1.5), rollout([(1, 3)], [1.0]))
got = [round(v, 6) for v in out["advantages"][0, :3].tolist()]
verdict(f"AReaL PPOActor._compute_advantages with discount 1.5 (trainer/ppo/actor.py:226; the config checks "
        f"read discount / gae_lambda: {sorted({'discount', 'gae_lambda'} & checks)}): the advantages of a "
        "3-token response with reward 1", got, "an error (0 <= gamma <= 1, 0 <= lambda <= 1)",
        not {"discount", "gae_lambda"} & checks and got == [2.25, 1.5, 1.0])
""",
        ("areal", "config:kl_ctl"): _SILENT_AREAL + _AREAL_ACTOR + _POST_INIT_READS + """\
trainer_source = (root / "trainer" / "rl_trainer.py").read_text()
builds_ref = "if config.actor.kl_ctl > 0 and config.ref is not None:" in trainer_source
batch = rollout([(1, 3)], [0.0], logp=-1.0)
batch["ref_logp"] = torch.full((1, 4), -3.0)  # a reference 2 nats below the policy on every token
out = compute_advantages(actor(kl_ctl=-0.1), batch)
got = [round(v, 6) for v in out["kl_rewards"][0, :3].tolist()]
verdict(f"AReaL kl_ctl -0.1 (the config checks read kl_ctl: {'kl_ctl' in checks}; rl_trainer.py:179 builds "
        f"the reference only for kl_ctl > 0: {builds_ref}); PPOActor._compute_advantages "
        "(trainer/ppo/actor.py:202) with log pi_old - log pi_ref = 2: the KL reward per token", got,
        "an error (a KL penalty's coefficient is >= 0), or -0.2 per token with kl_ctl 0.1",
        "kl_ctl" not in checks and builds_ref and got == [0.2, 0.2, 0.2])
""",
        ("areal", "config:critic_eps_clip"): _SILENT_AREAL + _AREAL_ACTOR + _AREAL + _POST_INIT_READS + """\
value = torch.ones(1, 1, requires_grad=True)
loss, _ = functional.ppo_critic_loss_fn(value, torch.ones(1, 1), torch.ones(1, 1), -0.5,
                                        torch.ones(1, 1, dtype=torch.bool))
got = [loss.item(), torch.autograd.grad(loss, value)[0].item()]
verdict(f"AReaL ppo_critic_loss_fn with PPOCriticConfig.eps_clip -0.5 (utils/functional/functional.py:757; "
        f"the config checks read eps_clip: {'eps_clip' in checks}), value = old value = return = 1: "
        "[loss, d loss / d value]", got, "[0.0, 0.0] or an error (the value clip needs eps >= 0)",
        "eps_clip" not in checks and got == [0.125, 0.0])
""",
        ("areal", "config:mean_leave1out"): _SILENT_AREAL + _AREAL_ACTOR + _NORM_CONFIG + """\
checked["__post_init__"](SimpleNamespace(mean_level=None, std_level=None, group_size=4, mean_leave1out=True))
rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
got = norm(mean_level=None, mean_leave1out=True, std_level=None, group_size=4)(rewards).tolist()
verdict("AReaL NormConfig(mean_level=None, mean_leave1out=True) accepted (api/cli_args.py:80-97); "
        "Normalization (utils/data.py:1445) on rewards (1, 0, 0, 0)", got,
        "[1.0, -0.333, -0.333, -0.333] (RLOO) or an error (leave-one-out without a mean does nothing)",
        got == [1.0, 0.0, 0.0, 0.0])
""",
        ("areal", "config:overlong_penalty_factor"): _SILENT_AREAL + _AREAL + """\
got = []
for length in (10, 20):
    data = {"rewards": torch.zeros(1), "input_ids": torch.zeros(1, length, dtype=torch.long),
            "loss_mask": torch.ones(1, length)}
    got.append(functional.reward_overlong_penalty(data, overlong_tokens=5, overlong_penalty_factor=-1.0,
                                                  max_response_length=20)["rewards"].item())
verdict("AReaL reward_overlong_penalty(overlong_penalty_factor=-1) (utils/functional/functional.py:798), "
        "max_new_tokens 20, overlong_tokens 5: accepted; the rewards of responses of 10 and 20 tokens", got,
        "[0.0, -1.0] with factor 1, or an error (DAPO's factor is > 0)", got == [-1.0, 0.0])
""",
        **_fourth_audit_bodies(_AREAL_ACTOR, _SILENT_AREAL),
    }


def _fourth_audit_bodies(_AREAL_ACTOR: str, _SILENT_AREAL: str) -> dict[tuple[str, str], str]:
    """The scripts of a fourth audit's findings (the end of areal_findings.AUDIT_FINDINGS)."""
    return {
        ("areal", "adv_std_batch_mean"): _AREAL_ACTOR + """\
rewards = torch.tensor([3.0, 1.0, 0.0, 0.0])  # two groups of 2; the batch mean is 1
out = norm(mean_level="batch", std_level="group", group_size=2, eps=0.0)(rewards)
got = [round(v, 6) for v in out[:2].tolist()]
first = rewards[:2]
exact = [round(v, 6) for v in ((first - rewards.mean()) / first.std()).tolist()]
verdict("AReaL Normalization(mean_level='batch', std_level='group', eps=0) (utils/data.py:1484) on rewards "
        "(3, 1, 0, 0), groups of 2: the first group's advantages", got,
        f"{exact} (x - batch mean over the group's own sample std)", got == [1.0, 0.0])
""",
        ("areal", "config:kl_estimator"): _SILENT_AREAL + _AREAL_ACTOR + """\
cli_tree = ast.parse((root / "api" / "cli_args.py").read_text())
actor_class = next(n for n in cli_tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOActorConfig")
field_call = next(item.value for item in actor_class.body
                  if isinstance(item, ast.AnnAssign) and item.target.id == "kl_estimator")
choices = ast.literal_eval(next(kw.value for kw in field_call.keywords if kw.arg == "metadata"))["choices"]
z = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)  # the policy's logits at one state (one decision)
ref = torch.log_softmax(torch.tensor([2.0, -1.0, 0.0]), 0)
pi = torch.softmax(z.detach(), 0)
got = {}
for name in ("k1", "k3"):
    grad = torch.zeros(3)
    for a in range(3):  # every sampled token, weighted by its probability: the expected gradient
        logp = torch.log_softmax(z, 0)[a]
        reward = -1.0 * data["KLEstimator"](name)(logp.detach().reshape(1), ref[a].reshape(1))  # kl_ctl 1
        grad += pi[a] * torch.autograd.grad(logp * reward.item(), z)[0]  # the score-function gradient
    got[name] = [round(v, 3) for v in grad.tolist()]
q = torch.softmax(z, 0)
exact = [round(-v, 3) for v in torch.autograd.grad((q * (torch.log(q) - ref)).sum(), z)[0].tolist()]
verdict(f"AReaL PPOActorConfig.kl_estimator choices {choices} accepted for the KL reward "
        "(trainer/ppo/actor.py:202); the expected policy gradient of the reward -KLEstimator(k) at one "
        "decision, per estimator", got,
        f"{exact} = -grad KL(pi || pi_ref) (k1 gives it; k2 / k3 as a detached reward do not)",
        got["k1"] == exact and got["k3"] != exact)
""",
    }
