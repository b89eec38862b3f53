"""An implementation for the numpy consumer: the KL estimators k1, k2, k3 in plain numpy
(kl.md eqs. (2)-(4), log r = ref_logp - logp), which passes every vector of kl.json:

    python tools/consumers/numpy_consumer.py tools/consumers/example_kl.py --only kl

k3 needs a series for small |log r|: ``expm1(x) - x`` still loses every digit at x = 2^-52, which
the ``log_ratio_tiny`` vectors catch. Invalid input (NaN, infinite log-probs) raises ValueError,
as the invalid vectors require."""

import numpy as np


def kl(estimator, logp, ref_logp):
    """(value, d value / d logp) per token."""
    if not (np.isfinite(logp).all() and np.isfinite(ref_logp).all()):
        raise ValueError("logp and ref_logp must be finite")
    x = ref_logp - logp
    if estimator == "k1":
        return -x, np.ones_like(x)
    if estimator == "k2":
        return 0.5 * x * x, -x
    if estimator != "k3":
        raise ValueError(f"estimator must be k1, k2 or k3, got {estimator!r}")
    small = np.abs(x) < 1e-2
    xs = np.where(small, x, 0.0)
    series = xs * xs * (1 / 2 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs * (1 / 720 + xs / 5040)))))
    with np.errstate(over="ignore"):
        return np.where(small, series, np.expm1(x) - x), -np.expm1(x)
