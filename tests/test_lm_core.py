"""refimpl.lm building blocks: tasks and rewards, the model and its KV cache, the sampler and the
trainer's log-probs under the same sampling policy (temperature, top-k, EOS, masks)."""

import pytest
import torch

from refimpl.lm.checkpoint import check_model_config, load_checkpoint, save_checkpoint
from refimpl.lm.model import GPT, GPTConfig, KVCache
from refimpl.lm.rollout import generate, lengths_to_mask, policy_logprobs, response_logits
from refimpl.lm.tasks import EOS, PAD, VOCAB, decode, encode, get_task

# ------------------------------------------------------------------------------------ tasks


def test_addition_targets_are_reversed_sums_with_eos():
    task = get_task("addition", eval_size=64)
    problems = task.sample_problems(200, torch.Generator().manual_seed(0))
    for prompt, target, length in zip(
        problems.prompts, problems.targets, problems.target_lengths, strict=True
    ):
        text = decode(prompt)
        assert len(text) == 8 and text[3] == "+" and text[7] == "="
        expected = str(int(text[:3]) + int(text[4:7]))[::-1] + "$"
        assert int(length) == len(expected)
        assert decode(target[: int(length)]) == expected
        assert set(decode(target[int(length) :])) <= {"_"}


def test_sort_targets_are_sorted_digits_with_eos():
    task = get_task("sort", eval_size=64)
    problems = task.sample_problems(100, torch.Generator().manual_seed(1))
    for prompt, target in zip(problems.prompts, problems.targets, strict=True):
        text = decode(prompt)
        assert decode(target) == "".join(sorted(text[:6])) + "$"


def test_held_out_set_is_fixed_and_disjoint_from_training_problems():
    task = get_task("addition", eval_size=400, eval_seed=7)
    again = get_task("addition", eval_size=400, eval_seed=7)
    assert torch.equal(task.eval_problems().prompts, again.eval_problems().prompts)
    held_out = {decode(p) for p in task.eval_problems().prompts}
    assert len(held_out) == 400
    train = task.sample_problems(20000, torch.Generator().manual_seed(3))
    assert not held_out & {decode(p) for p in train.prompts}


def test_rewards_exact_and_partial():
    task = get_task("addition", eval_size=8)
    problems = task._problems_from_keys(torch.tensor([123 * 1000 + 45, 999 * 1000 + 999, 0]))
    # 123+045=168 -> "861$"; 999+999=1998 -> "8991$"; 0+0=0 -> "0$"
    cases = [
        ("861$", 4, 0, 1.0, 1.0),
        ("861", 3, 0, 0.0, 0.5 * 3 / 4),  # no EOS: wrong
        ("8612", 4, 0, 0.0, 0.5 * 3 / 4),  # an extra digit instead of EOS
        ("8991$", 5, 1, 1.0, 1.0),
        ("8990$", 5, 1, 0.0, 0.5 * 4 / 5),
        ("0$", 2, 2, 1.0, 1.0),
        ("00$", 3, 2, 0.0, 0.5 * 1 / 2),
    ]
    width = 6
    responses = torch.full((len(cases), width), PAD)
    for i, (text, *_rest) in enumerate(cases):
        responses[i, : len(text)] = torch.tensor(encode(text))
    lengths = torch.tensor([c[1] for c in cases])
    sub = problems.index(torch.tensor([c[2] for c in cases]))
    assert task.rewards(responses, lengths, sub).tolist() == [c[3] for c in cases]
    partial = task.rewards(responses, lengths, sub, kind="partial")
    assert partial.tolist() == pytest.approx([c[4] for c in cases], abs=1e-7)


def test_bad_task_inputs():
    with pytest.raises(ValueError, match="unknown task"):
        get_task("multiplication")
    with pytest.raises(ValueError, match="eval_size"):
        get_task("addition", eval_size=0)
    with pytest.raises(ValueError, match="vocabulary"):
        encode("12a")
    task = get_task("addition", eval_size=8)
    with pytest.raises(ValueError, match="kind"):
        p = task.eval_problems()
        task.rewards(p.targets, p.target_lengths, p, kind="fuzzy")


# ------------------------------------------------------------------------------------ model


def _model(positions="learned", seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(
        GPTConfig(
            vocab_size=len(VOCAB), block_size=16, n_layer=2, n_head=2, n_embd=16, positions=positions, **kw
        )
    )


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_kv_cache_logits_equal_uncached(positions):
    model = _model(positions).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(len(VOCAB), (5, 14), generator=g)
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(model.config, 5, 14, "cpu", torch.float32)
        parts = [model(tokens[:, :6], cache=cache)]  # prefill, then one token at a time
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(6, 14)]
    cached = torch.cat(parts, dim=1)
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_model_is_causal_and_tied(positions):
    model = _model(positions).eval()
    a = torch.randint(len(VOCAB), (2, 10), generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b[:, 6:] = (b[:, 6:] + 1) % len(VOCAB)
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :6], lb[:, :6], rtol=0, atol=0)
    # every later position reads the changed tokens: its logits move by far more than float32
    # roundoff of logits of size < 1 (~1e-7)
    assert bool(((la[:, 6:] - lb[:, 6:]).abs().amax(dim=-1) > 1e-3).all())
    assert model.lm_head.weight is model.wte.weight


def test_model_config_errors():
    with pytest.raises(ValueError, match="n_embd"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="positions"):
        GPTConfig(positions="alibi")
    with pytest.raises(ValueError, match="block_size"):
        _model()(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="value head"):
        _model()(torch.zeros(1, 3, dtype=torch.long), return_values=True)


# ------------------------------------------------------------------------------------ sampler


def _sample(model, prompts, seed, **kwargs):
    """``generate`` with EOS, PAD (unless given) and a seeded generator."""
    kwargs.setdefault("pad", PAD)
    return generate(model, prompts, eos=EOS, generator=torch.Generator().manual_seed(seed), **kwargs)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0), (1.3, 5)])
def test_trainer_logprobs_equal_sampler_logprobs(temperature, top_k):
    """The trainer scores the sampled tokens under the sampling policy itself (temperature and
    top-k included): equal to the sampler's log-probs to 1e-5 in float32."""
    model = _model().eval()
    prompts = torch.randint(10, (64, 6), generator=torch.Generator().manual_seed(2))
    ro = _sample(model, prompts, 3, max_new_tokens=8, temperature=temperature, top_k=top_k)
    with torch.no_grad():
        logits = response_logits(model, ro.prompts, ro.responses)
    logp, entropy = policy_logprobs(logits, ro.responses, temperature, ro.topk_indices)
    m = ro.mask
    assert m.sum() > 64  # several tokens per response on average
    torch.testing.assert_close(logp[m], ro.logprobs[m], rtol=0, atol=1e-5)
    assert torch.all(entropy[m] >= 0)
    if temperature != 1.0 or top_k:
        # the trap: scoring without the sampling transform gives different log-probs
        plain = torch.log_softmax(logits.float(), -1).gather(-1, ro.responses[..., None])[..., 0]
        assert (plain[m] - ro.logprobs[m]).abs().max() > 1e-2


def test_top_k_restricts_samples_and_renormalises():
    model = _model().eval()
    prompts = torch.randint(10, (256, 4), generator=torch.Generator().manual_seed(4))
    ro = _sample(model, prompts, 5, max_new_tokens=3, top_k=2)
    assert ro.topk_indices.shape == (256, 3, 2)
    sampled_in_set = (ro.topk_indices == ro.responses[..., None]).any(-1)
    assert sampled_in_set[ro.mask].all()
    with torch.no_grad():
        logits = response_logits(model, ro.prompts, ro.responses)
    # log-probs of the two members of the set sum to probability 1
    z = logits.gather(-1, ro.topk_indices)
    total = torch.logsumexp(z - torch.logsumexp(z, -1, keepdim=True), -1)
    torch.testing.assert_close(total, torch.zeros_like(total), rtol=0, atol=1e-6)


def test_first_token_frequencies_match_the_tempered_softmax():
    """Sampling follows softmax(logits / T): empirical frequencies within 5 binomial sigmas."""
    model = _model(seed=3).eval()
    n, temperature = 20000, 0.8
    prompts = torch.tensor(encode("12+34="))[None].repeat(n, 1)
    ro = _sample(model, prompts, 6, max_new_tokens=1, temperature=temperature)
    with torch.no_grad():
        p = torch.softmax(model(prompts[:1])[0, -1].double() / temperature, -1)
    freq = torch.bincount(ro.responses[:, 0], minlength=len(VOCAB)).double() / n
    sigma = (p * (1 - p) / n).sqrt()
    assert torch.all((freq - p).abs() <= 5 * sigma + 1e-12)


@pytest.mark.parametrize("pad", [PAD, EOS])
def test_masks_come_from_sampled_lengths_and_eos_is_trained(pad):
    """Masks cover each response through its first EOS (EOS included), also when pad == EOS, and
    the EOS log-prob receives gradient."""
    model = _model(seed=5)
    with torch.no_grad():  # make EOS likely so that responses end at different lengths
        model.lm_head.weight[EOS] += 0.5 * model.lm_head.weight.std()
    prompts = torch.randint(10, (128, 5), generator=torch.Generator().manual_seed(7))
    ro = _sample(model, prompts, 8, max_new_tokens=6, pad=pad, temperature=2.0)
    lengths = ro.lengths
    assert len(set(lengths.tolist())) >= 3
    for row, length, trunc, mrow in zip(ro.responses, lengths, ro.truncated, ro.mask, strict=True):
        tokens = row.tolist()
        first_eos = tokens.index(EOS) + 1 if EOS in tokens[: int(length)] else None
        assert int(length) == (6 if trunc else first_eos)
        assert mrow.tolist() == [t < int(length) for t in range(6)]
        if not trunc:
            assert tokens[int(length) - 1] == EOS
    assert torch.equal(ro.mask, lengths_to_mask(lengths, 6))
    ended = ~ro.truncated
    assert ended.sum() > 10
    # EOS is a trained action: the loss on the EOS positions has a gradient
    logits = response_logits(model, ro.prompts, ro.responses)
    logp, _ = policy_logprobs(logits, ro.responses)
    eos_positions = torch.zeros_like(ro.mask)
    eos_positions[ended, lengths[ended] - 1] = True
    assert (eos_positions & ro.mask).sum() == ended.sum()
    model.zero_grad()
    (logp * eos_positions).sum().backward()
    assert model.lm_head.weight.grad[EOS].abs().sum() > 0


def test_generate_rejects_bad_arguments():
    model = _model()
    prompts = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompts, max_new_tokens=2, eos=EOS, pad=PAD, temperature=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompts, max_new_tokens=0, eos=EOS, pad=PAD)
    with pytest.raises(ValueError, match="top_k"):
        generate(model, prompts, max_new_tokens=2, eos=EOS, pad=PAD, top_k=-1)


def test_greedy_generation_with_and_without_cache_agree():
    model = _model(seed=9).eval()
    prompts = torch.randint(12, (32, 8), generator=torch.Generator().manual_seed(9))
    a = generate(model, prompts, max_new_tokens=8, eos=EOS, pad=PAD, greedy=True)
    b = generate(model, prompts, max_new_tokens=8, eos=EOS, pad=PAD, greedy=True, use_cache=False)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ checkpoints


def test_checkpoint_roundtrip_and_shape_check(tmp_path):
    model = _model()
    path = save_checkpoint(
        tmp_path / "c.pt", {"model": model.state_dict(), "model_config": model.config.to_dict()}
    )
    state = load_checkpoint(path)
    other = _model(seed=1)
    other.load_state_dict(state["model"])
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True)
    )
    bigger = GPTConfig(vocab_size=len(VOCAB), block_size=16, n_layer=2, n_head=2, n_embd=32).to_dict()
    with pytest.raises(ValueError, match="n_embd: checkpoint 16, this run 32"):
        check_model_config(state["model_config"], bigger, path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_rope_rotation_preserves_norms():
    from refimpl.lm.model import _rotate

    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0))
    y = _rotate(x, torch.arange(5))
    # float32: the rounded (cos, sin) have norm 1 within u, each rotated entry carries ~3u of its
    # pair's norm, and the 8-term norm ~5u more: 16u bounds the relative change of the norm
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=16 * 2.0**-24, atol=0.0)
    assert torch.equal(y[:, :, 0], x[:, :, 0])  # position 0 is not rotated: cos 0 = 1, sin 0 = 0 exactly
    assert float((y[:, :, 3] - x[:, :, 3]).abs().max()) > 1e-3
