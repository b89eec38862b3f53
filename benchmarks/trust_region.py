"""Fisher-vector products by double backprop vs forming the Fisher matrix explicitly.

For a softmax MLP policy over N = 256 states (16 features, A = 8 actions, one tanh hidden layer of
growing width, so P = 25 h + 8 parameters), prints, measured in one run (best of 3):
  * one product F v: refimpl.trust_region.fisher_vector_product (mean-KL Hessian by double
    backprop, never forming F) vs the explicit route (per-(state, action) Jacobian of the
    log-probabilities by torch.func.jacrev, F = sum_s w_s sum_a pi (grad log pi)(grad log pi)^T,
    then F @ v);
  * a CG solve of F x = g with 10 iterations: fisher_vector_product_fn (graph built once, 10
    backward passes) vs explicit F formed once plus 10 mat-vecs;
  * the relative difference of the two products (float64) and the bytes F would occupy.
Run: .venv/bin/python benchmarks/trust_region.py   (about a minute on one idle core; the explicit
Jacobian dominates)
"""

from __future__ import annotations

import time

import torch

from refimpl.trust_region import conjugate_gradient, fisher_vector_product, fisher_vector_product_fn

NUM_STATES, FEATURES, ACTIONS = 256, 16, 8
HIDDEN = (8, 32, 128, 256)
CG_ITERS = 10
DTYPE = torch.float64


def mlp_policy(features: torch.Tensor, hidden: int):
    """``params [P] -> log pi [N, A]`` for a one-hidden-layer tanh MLP with flat parameters."""
    shapes = [(FEATURES, hidden), (hidden,), (hidden, ACTIONS), (ACTIONS,)]
    sizes = [torch.Size(s).numel() for s in shapes]

    def log_probs(params: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = (p.reshape(s) for p, s in zip(params.split(sizes), shapes, strict=True))
        return torch.log_softmax(torch.tanh(features @ w1 + b1) @ w2 + b2, dim=-1)

    return log_probs, sum(sizes)


def explicit_fisher(log_probs, params: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """F = J^T diag(w_s pi(a|s)) J with J the [N*A, P] Jacobian of the log-probabilities."""
    jac = torch.func.jacrev(log_probs)(params).reshape(-1, params.numel())
    pi = log_probs(params).exp().detach()
    scaled = jac * (weights[:, None] * pi).reshape(-1, 1).sqrt()
    return scaled.T @ scaled


def best_of(fn, repeats: int = 3):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def measure(hidden: int, features: torch.Tensor, weights: torch.Tensor) -> str:
    """One table row for a hidden width."""
    log_probs, num_params = mlp_policy(features, hidden)
    params = 0.5 * torch.randn(num_params, dtype=DTYPE)
    v = torch.randn(num_params, dtype=DTYPE)
    damped_eye = 1e-3 * torch.eye(num_params, dtype=DTYPE)

    def cg_double_backprop():
        fvp = fisher_vector_product_fn(log_probs, params, weights, damping=1e-3)
        return conjugate_gradient(fvp, v, CG_ITERS, 0.0)

    def cg_explicit():
        fisher = explicit_fisher(log_probs, params, weights) + damped_eye
        return conjugate_gradient(lambda x: fisher @ x, v, CG_ITERS, 0.0)

    fisher_vector_product(log_probs, params, v, weights)  # warm-up (first autograd call)
    fv, t_fvp = best_of(lambda: fisher_vector_product(log_probs, params, v, weights))
    fv_explicit, t_explicit = best_of(lambda: explicit_fisher(log_probs, params, weights) @ v)
    _, t_cg = best_of(cg_double_backprop)
    _, t_cg_explicit = best_of(cg_explicit)
    rel = float((fv - fv_explicit).norm() / fv_explicit.norm())
    return (f"{num_params:>6} {num_params**2 * 8:>9.2e} | {1e3 * t_fvp:>9.2f} {1e3 * t_explicit:>11.2f} "
            f"{t_explicit / t_fvp:>6.1f} | {1e3 * t_cg:>11.2f} {1e3 * t_cg_explicit:>13.2f} "
            f"{t_cg_explicit / t_cg:>6.1f} | {rel:>8.1e}")


def main() -> None:
    torch.manual_seed(0)
    features = torch.randn(NUM_STATES, FEATURES, dtype=DTYPE)
    weights = torch.rand(NUM_STATES, dtype=DTYPE)
    weights = weights / weights.sum()
    print(f"N = {NUM_STATES} states, A = {ACTIONS}, float64, {torch.get_num_threads()} threads; "
          "times in ms (best of 3)")
    header = (f"{'P':>6} {'F bytes':>9} | {'Fv dbl-bp':>9} {'Fv explicit':>11} {'ratio':>6} | "
              f"{'CG10 dbl-bp':>11} {'CG10 explicit':>13} {'ratio':>6} | {'rel diff':>8}")
    print(header)
    print("-" * len(header))
    for hidden in HIDDEN:
        print(measure(hidden, features, weights), flush=True)
    print("ratio = explicit time / double-backprop time (> 1: double backprop is faster).")


if __name__ == "__main__":
    main()
