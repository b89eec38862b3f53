"""Token log-probabilities of acme-rl."""

import torch


def token_logprobs(logits, tokens):
    """log softmax(logits)[token] per position, in float32 at least. logits: [N, T, V];
    tokens: [N, T] -> [N, T]."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
