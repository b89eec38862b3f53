"""The fused function ahead of time: one AOTInductor package per plan, called without dynamo.

spec: specs/policy_losses.md eq. (12) (what ``refimpl.losses.fused_kernel._fused`` computes; this
module only changes how it is compiled and called). ``fused_policy_loss(..., compile="aot")`` runs
``_fused`` through ``torch.export`` (N and T dynamic, from 2 up) and AOTInductor
(``torch._inductor.aoti_compile_and_package``): a shared library with a C++ wrapper, called through
``AOTIModelPackageLoader.run`` with the present inputs as a flat list. No dynamo guards, no
AOT-autograd runtime wrappers, no Python wrapper code: the call's fixed cost is the C++ runner's
(issue 29, item 2; docs/results.md has the measurements).

Cached across processes: the package is kept under inductor's cache directory
(``fused_policy_aot/<key>.pt2``), the key a SHA-256 of the torch version, the device's kind and
vector instruction set, the dtypes, the plan and the source of every module whose code the graph
holds (this one, the fused function's, the policy family's, the KL estimators'): a change to any of
them compiles anew, and a second process loads the package in milliseconds. On a CPU AOTInductor
needs a C++ compiler, as ``torch.compile`` does; its first package in a cache directory also builds
precompiled headers (a one-time cost).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile

import torch

import refimpl.kl
import refimpl.losses.policy
from refimpl.losses import fused_kernel
from refimpl.losses.fused_kernel import _fused, _Plan


class _Exported(torch.nn.Module):
    """``_fused`` for one plan over the inputs present (``None`` slots left out), returning its
    outputs that are not None: what ``torch.export`` can take and AOTInductor's runner returns."""

    def __init__(self, plan: _Plan, present: tuple[bool, ...]):
        super().__init__()
        self.plan, self.present = plan, present

    def forward(self, *tensors):
        given = iter(tensors)
        inputs = [next(given) if here else None for here in self.present]
        return tuple(x for x in _fused(*inputs, plan=self.plan) if x is not None)


def _isa(device: torch.device) -> str:
    """The code generator's target: the vector ISA on a CPU, the compute capability on CUDA."""
    if device.type == "cpu":
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        return str(pick_vec_isa())
    if device.type == "cuda":
        return "sm_{}{}".format(*torch.cuda.get_device_capability(device))
    return device.type


def _key(plan: _Plan, dtypes: tuple, device: torch.device) -> str:
    """The package's name: everything its code depends on (module docstring)."""
    sources = [inspect.getsource(module) for module in
               (fused_kernel, refimpl.losses.policy, refimpl.kl, inspect.getmodule(_Exported))]
    text = repr((torch.__version__, device.type, _isa(device), dtypes, plan)) + "".join(sources)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _small(inputs: tuple) -> list[torch.Tensor | None]:
    """Zeros of shape [2, 3] / [2] (N and T distinct, so that export keeps them apart) in the dtypes
    and on the device of the call's inputs; the [1] scalars as they are, None where None."""
    return [x if x is None or i >= 8 else x.new_zeros((2, 3) if x.ndim == 2 else (2,))
            for i, x in enumerate(inputs)]


def _examples(inputs: tuple) -> tuple[list[torch.Tensor], list[dict | None]]:
    """Export's example inputs (``_small``'s, None left out) and their dynamic dimensions."""
    n, t = torch.export.Dim("N", min=2), torch.export.Dim("T", min=2)
    examples = [x for x in _small(inputs) if x is not None]
    dims = [None if x.shape == (1,) else {0: n, 1: t} if x.ndim == 2 else {0: n} for x in examples]
    return examples, dims


def _compile(plan: _Plan, inputs: tuple, path: str, options: dict | None) -> None:
    """Export and compile the package to ``path`` (written whole, then renamed: a reader never sees
    a partial file)."""
    present = tuple(x is not None for x in inputs)
    examples, dims = _examples(inputs)
    program = torch.export.export(_Exported(plan, present), tuple(examples), dynamic_shapes=(tuple(dims),))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(path))
    os.close(handle)
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=partial,
                                                 inductor_configs=options or {})
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _package_dir() -> str:
    """Where the packages are kept: ``fused_policy_aot`` in inductor's cache directory."""
    from torch._inductor.codecache import cache_dir

    return os.path.join(cache_dir(), "fused_policy_aot")


def _runner(path: str, device_index: int):
    """The C++ runner of the package at ``path`` (``run(list of tensors) -> list of tensors``)."""
    return torch._inductor.aoti_load_package(path, device_index=device_index).loader


class AotKernel:
    """``_fused`` for one plan, dtypes and device as an AOTInductor package: the same arguments and
    results as ``_fused`` (its ``None`` inputs and outputs included). The package is found or made
    on the first call (``_key``), then every call is one ``run`` of its C++ runner."""

    def __init__(self, plan: _Plan, device: torch.device, options: dict | None):
        self.plan, self.device, self.options = plan, device, options
        self.runner = None
        self.outputs: tuple[bool, ...] = ()  # which of _fused's outputs are not None

    def _load(self, inputs: tuple) -> None:
        dtypes = tuple(None if x is None else x.dtype for x in inputs)
        path = os.path.join(_package_dir(), _key(self.plan, dtypes, self.device) + ".pt2")
        if not os.path.exists(path):
            _compile(self.plan, inputs, path, self.options)
        self.runner = _runner(path, -1 if self.device.index is None else self.device.index)
        # which outputs exist (the plan decides): one op-by-op run on [2, 3] zeros
        self.outputs = tuple(x is not None for x in _fused(*_small(inputs), plan=self.plan))

    def __call__(self, *inputs):  # _fused's 11 tensor arguments, None where absent
        if self.runner is None:
            self._load(inputs)
        results = iter(self.runner.run([x for x in inputs if x is not None]))
        return tuple(next(results) if here else None for here in self.outputs)
