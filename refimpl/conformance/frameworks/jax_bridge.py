"""A JAX function as a torch function: what a driver of a JAX framework (Tunix) hands the kit.

``from_jax(x, fn, *args)`` evaluates ``fn(x, *args)`` of JAX on ``x`` (a torch tensor, rounded to
float32: JAX computes in float32 unless ``jax_enable_x64`` is set) and returns a torch tensor whose
gradient reaches ``x`` through ``jax.vjp``. Both the value and the vector-Jacobian product are
compiled with ``jax.jit`` (as a JAX trainer compiles its step) and cached per ``fn`` and per shape, so
the kit's cases of one shape compile once. The gradient is handed back in ``x``'s dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["compiled_value", "float32", "from_jax"]


def float32(t):
    """``t`` (a torch tensor, or None) as a float32 numpy array on the host."""
    return None if t is None else t.detach().to("cpu").float().numpy()


@functools.cache
def _compiled(fn: Callable) -> tuple[Callable, Callable]:
    """``fn(x, *args)`` compiled: its value, and its vector-Jacobian product in ``x``."""
    import jax

    def pullback(x, args, cotangent):
        return jax.vjp(lambda y: fn(y, *args), x)[1](cotangent)[0]

    return jax.jit(fn), jax.jit(pullback)


@functools.cache
def _function():
    import torch

    class FromJax(torch.autograd.Function):
        """``fn(x, *args)`` of JAX on the float32 ``x``; backward: its compiled ``jax.vjp``."""

        @staticmethod
        def forward(ctx, x, fn, *args):
            import numpy as np

            ctx.fn, ctx.x, ctx.args, ctx.dtype = fn, float32(x), args, x.dtype
            return torch.from_numpy(np.array(_compiled(fn)[0](ctx.x, *args)))

        @staticmethod
        def backward(ctx, grad):
            import numpy as np

            g = _compiled(ctx.fn)[1](ctx.x, ctx.args, float32(grad))
            return (torch.from_numpy(np.array(g)).to(ctx.dtype), None, *(None for _ in ctx.args))

    return FromJax


def from_jax(x, fn: Callable, *args):
    """``fn(x, *args)`` (JAX, float32; ``args`` numpy arrays or None) as a torch tensor whose gradient
    reaches ``x``. ``fn`` must be hashable and stable (a module-level or cached function): the compiled
    functions are cached on it."""
    return _function().apply(x, fn, *args)


def compiled_value(fn: Callable, *args):
    """``fn(*args)`` of JAX, compiled and cached like ``from_jax``, without a gradient (numpy arrays
    in, a tuple of torch tensors out)."""
    import numpy as np
    import torch

    out = _compiled(fn)[0](*args)
    return tuple(torch.from_numpy(np.array(o)) for o in (out if isinstance(out, tuple) else (out,)))
