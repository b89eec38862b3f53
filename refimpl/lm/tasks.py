"""Tasks with verifiable rewards, generated in-process from a seed (nothing is downloaded).

A task turns a ``torch.Generator`` into problems: fixed-length prompts (every prompt of a task
has the same length, so batched sampling needs no left padding) and target answers that end in an
explicit EOS token. The reward compares a sampled response with the target.

* ``addition``: ``"123+045="`` -> the sum's digits *reversed* (least significant first, so a
  causal model can carry), no leading zeros, then EOS: ``"861$"``. Answers have 1-4 digits, so
  the response length varies and EOS is a decision the policy must learn.
* ``sort``: ``"503912="`` -> the digits sorted ascending, then EOS: ``"012359$"``.

The held-out evaluation set of each task is a fixed function of ``eval_seed``; training problems
are drawn so that they never coincide with a held-out prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "VOCAB",
    "EOS",
    "PAD",
    "Problems",
    "Task",
    "AdditionTask",
    "SortTask",
    "TASKS",
    "get_task",
    "encode",
    "decode",
]

# One vocabulary for every task: digits, operators, EOS ("$") and padding ("_").
VOCAB: tuple[str, ...] = tuple("0123456789+=$_")
EOS: int = VOCAB.index("$")
PAD: int = VOCAB.index("_")
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (characters of ``VOCAB``)."""
    try:
        return [_INDEX[ch] for ch in text]
    except KeyError as err:
        raise ValueError(
            f"text: character {err.args[0]!r} is not in the vocabulary {''.join(VOCAB)!r}"
        ) from None


def decode(tokens) -> str:
    """Text of a sequence of token ids (a list or a 1-D tensor)."""
    return "".join(VOCAB[int(t)] for t in tokens)


@dataclass(frozen=True)
class Problems:
    """A batch of problems. ``prompts [n, P]`` (long); ``targets [n, A]`` the answers including
    their EOS, right-padded with PAD; ``target_lengths [n]`` the number of answer tokens
    including EOS."""

    prompts: torch.Tensor
    targets: torch.Tensor
    target_lengths: torch.Tensor

    def __len__(self) -> int:
        return self.prompts.shape[0]

    def index(self, idx: torch.Tensor) -> Problems:
        return Problems(self.prompts[idx], self.targets[idx], self.target_lengths[idx])

    def to(self, device) -> Problems:
        return Problems(self.prompts.to(device), self.targets.to(device), self.target_lengths.to(device))


def _digits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Decimal digits of non-negative ints ``values [n]``, most significant first, zero-padded to
    ``width``: ``[n, width]`` digit values 0-9 (which are also their token ids)."""
    powers = 10 ** torch.arange(width - 1, -1, -1, device=values.device)
    return (values[:, None] // powers) % 10


class Task:
    """Interface of a task. Subclasses define ``name``, ``prompt_len``, ``max_answer_len``
    (tokens including EOS), ``num_keys`` and ``_problems_from_keys``."""

    name: str = ""
    prompt_len: int = 0
    max_answer_len: int = 0
    num_keys: int = 0  # problems are indexed by an integer key in [0, num_keys)

    def __init__(self, eval_size: int = 512, eval_seed: int = 1234):
        if eval_size < 1 or eval_size > self.num_keys // 2:
            raise ValueError(f"eval_size: expected 1 <= eval_size <= {self.num_keys // 2}, got {eval_size}")
        g = torch.Generator().manual_seed(eval_seed)
        self.eval_keys = torch.randperm(self.num_keys, generator=g)[:eval_size].sort().values
        self._is_eval_key = torch.zeros(self.num_keys, dtype=torch.bool)
        self._is_eval_key[self.eval_keys] = True

    def _problems_from_keys(self, keys: torch.Tensor) -> Problems:
        raise NotImplementedError

    def eval_problems(self) -> Problems:
        """The fixed held-out evaluation set."""
        return self._problems_from_keys(self.eval_keys)

    def sample_problems(self, n: int, generator: torch.Generator) -> Problems:
        """``n`` training problems drawn uniformly from the keys outside the held-out set."""
        if n < 1:
            raise ValueError(f"n: expected a positive number of problems, got {n}")
        # Rejection sampling: the held-out set is at most half of the keys, so few rounds suffice.
        keys = torch.empty(0, dtype=torch.long)
        while keys.numel() < n:
            draw = torch.randint(self.num_keys, (2 * n,), generator=generator)
            keys = torch.cat([keys, draw[~self._is_eval_key[draw]]])
        return self._problems_from_keys(keys[:n])

    def rewards(
        self, responses: torch.Tensor, lengths: torch.Tensor, problems: Problems, *, kind: str = "exact"
    ) -> torch.Tensor:
        """Reward of each response ``[n, L]`` whose first ``lengths[i]`` tokens were sampled.

        ``kind="exact"``: 1 if the response (through its EOS) equals the target, else 0. A
        response without EOS (truncated) has length > target or lacks the EOS, so it gets 0.
        ``kind="partial"``: the exact reward, or, for a wrong answer, 0.5 x the fraction of target
        positions (EOS included) whose token matches, as a dense shaping signal.
        Returns float32 ``[n]`` on the responses' device.
        """
        if kind not in ("exact", "partial"):
            raise ValueError(f"kind: expected 'exact' or 'partial', got {kind!r}")
        targets = problems.targets.to(responses.device)
        target_lengths = problems.target_lengths.to(responses.device)
        width = max(responses.shape[1], targets.shape[1])
        resp = _pad_to(responses, width)
        tgt = _pad_to(targets, width)
        positions = torch.arange(width, device=responses.device)
        in_target = positions[None, :] < target_lengths[:, None]
        in_response = positions[None, :] < lengths.to(responses.device)[:, None]
        matches = (resp == tgt) & in_target & in_response
        exact = (matches.sum(1) == target_lengths) & (lengths.to(responses.device) == target_lengths)
        reward = exact.float()
        if kind == "partial":
            partial = 0.5 * matches.sum(1).float() / target_lengths.float()
            reward = torch.where(exact, reward, partial)
        return reward


def _pad_to(tokens: torch.Tensor, width: int) -> torch.Tensor:
    if tokens.shape[1] >= width:
        return tokens[:, :width]
    pad = torch.full(
        (tokens.shape[0], width - tokens.shape[1]), PAD, dtype=tokens.dtype, device=tokens.device
    )
    return torch.cat([tokens, pad], dim=1)


class AdditionTask(Task):
    """3-digit addition ``"abc+def="`` with the sum's digits reversed, then EOS."""

    name = "addition"
    prompt_len = 8  # "abc+def="
    max_answer_len = 5  # up to 4 digits + EOS
    num_keys = 1000 * 1000

    def _problems_from_keys(self, keys: torch.Tensor) -> Problems:
        a, b = keys // 1000, keys % 1000
        n = keys.shape[0]
        plus = torch.full((n, 1), _INDEX["+"], dtype=torch.long)
        equals = torch.full((n, 1), _INDEX["="], dtype=torch.long)
        prompts = torch.cat([_digits(a, 3), plus, _digits(b, 3), equals], dim=1)
        total = a + b
        num_digits = 1 + (total >= 10).long() + (total >= 100).long() + (total >= 1000).long()
        reversed_digits = _digits(total, 4).flip(1)  # least significant first, then leading zeros
        positions = torch.arange(self.max_answer_len)
        targets = torch.cat([reversed_digits, torch.zeros(n, 1, dtype=torch.long)], dim=1)
        targets = torch.where(positions[None, :] < num_digits[:, None], targets, PAD)
        targets[torch.arange(n), num_digits] = EOS
        return Problems(prompts, targets, num_digits + 1)


class SortTask(Task):
    """Sort 6 digits ascending: ``"503912="`` -> ``"012359$"``."""

    name = "sort"
    num_digits = 6
    prompt_len = num_digits + 1
    max_answer_len = num_digits + 1
    num_keys = 10**num_digits

    def _problems_from_keys(self, keys: torch.Tensor) -> Problems:
        n = keys.shape[0]
        digits = _digits(keys, self.num_digits)
        equals = torch.full((n, 1), _INDEX["="], dtype=torch.long)
        eos = torch.full((n, 1), EOS, dtype=torch.long)
        prompts = torch.cat([digits, equals], dim=1)
        targets = torch.cat([digits.sort(dim=1).values, eos], dim=1)
        return Problems(prompts, targets, torch.full((n,), self.max_answer_len, dtype=torch.long))


TASKS: dict[str, type[Task]] = {"addition": AdditionTask, "sort": SortTask}


def get_task(name: str, **kwargs) -> Task:
    """The task called ``name`` (one of ``TASKS``)."""
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)
