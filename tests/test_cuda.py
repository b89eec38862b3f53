"""refimpl on a CUDA device, against the CPU (skipped, with its reason, where torch sees no CUDA).

* Every public computing function (the cases of tests/test_default_device.py, which fails when an
  export has none) on CUDA in float64, float32 and bfloat16, against the same call computed on the
  CPU in float64 from the same rounded inputs: values and gradients (``OnDevice`` below moves the
  inputs; the cases themselves are the CPU ones). Where the CPU refuses a dtype, CUDA must give the
  same error.
* The trainer for a few RL steps with bfloat16 autocast, with and without ``torch.compile``.
* A checkpoint written on CUDA evaluated on the CPU, and the reverse; resuming it across device
  types is refused in one line (exact resume needs the generator it sampled with).
* Every mode of every installed framework (``refimpl check framework F --device cuda``) passes
  under its own profile, its expected values computed on the device too.
* Two-rank data parallelism over NCCL, where two GPUs exist.

Tolerances (``_tolerance``): a device computes in another reduction order and with other last-bit
roundings of exp and log than the CPU, so its result may differ from the float64 reference by
what the CPU's own rounding does, scaled by the dtype's unit roundoff u: per result,
``|cuda - ref| <= 2 |cpu - ref| + (16 + n) A u s``, where s = max(1, max |ref|) (the cases' inputs
are of order 1), n the largest input's number of elements (a bound on the length of a reduction, whose
order the device chooses) and A >= 1 is the case's rounding-error amplification measured on the CPU in float32
(``max |cpu32 - ref| / (u32 s)``), which carries the case's conditioning over to float64, where
the CPU itself is the reference.

``RL_ORACLE_CUDA_DRY_RUN=1`` runs this module on the CPU ("cpu" against the float64 reference),
to check its logic on a machine without a GPU. ``test_on_device_is_transparent`` checks the input
mover itself on the CPU in every run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import traceback
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode, _pop_mode_temporarily
from torch.utils import _pytree as pytree

from refimpl.conformance.checks import check_framework_mode
from refimpl.conformance.frameworks import FRAMEWORKS, load_driver
from refimpl.lm.checkpoint import load_checkpoint, save_checkpoint
from refimpl.lm.run import RunError, run_training
from refimpl.lm.saved import evaluate_checkpoint, load_run_state
from refimpl.lm.train import Trainer
from refimpl.losses import fused_policy_loss
from tests.test_default_device import CASES, FLOATS, POLICY_CASES, _policy_case, _run
from tests.test_lm_train import PolicyLossSpy, tiny

DRY_RUN = os.environ.get("RL_ORACLE_CUDA_DRY_RUN") == "1"
DEVICE = "cpu" if DRY_RUN else "cuda"
on_device = pytest.mark.skipif(
    not DRY_RUN and not torch.cuda.is_available(),
    reason="no CUDA device (RL_ORACLE_CUDA_DRY_RUN=1 runs this module's logic on the CPU)",
)
DTYPES = (torch.float64, torch.float32, torch.bfloat16)


# ------------------------------------------------------------------------------------ moving inputs
def _in_place(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    return "out" in kwargs or name == "__setitem__" or (name.endswith("_") and not name.startswith("__"))


def _written(args, kwargs) -> tuple:
    """What an in-place call writes: its ``out=`` tensor(s) where given, else its first argument (an
    ``out=`` call only reads its first argument, e.g. a shared constant)."""
    if "out" in kwargs:
        out = kwargs["out"]
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return args[:1]


# getters and conversions that must see the tensor itself, not a copy
_AS_IS = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.data_ptr, torch.Tensor.grad.__get__,
          torch.Tensor.is_leaf.__get__, torch.Tensor._version.__get__}


class OnDevice(TorchFunctionMode):
    """Inside it, every tensor that was not made inside it and is on the CPU reaches each torch
    operation on ``device`` (and, when ``dtype`` is given, in ``dtype`` if it is floating): a CPU
    case then runs on the device, all its arithmetic there, and gradients flow back to the CPU
    inputs through the differentiable copies. ``copy=True`` copies even where nothing changes (a
    check of the mechanism on the CPU). An in-place operation on such an outside tensor would
    modify a copy and is refused."""

    def __init__(self, device, dtype: torch.dtype | None = None, copy: bool = False):
        super().__init__()
        self.device, self.dtype, self.copy = torch.device(device), dtype, copy
        self._made: dict[int, weakref.ref] = {}
        self.largest = 0  # elements of the largest tensor moved (a bound on a reduction's length)
        self._apply = None

    def __enter__(self):
        # A custom autograd.Function's apply is no torch operation the mode sees: its arguments would
        # reach forward (and be saved for backward, which runs outside the mode) on the CPU. Move them
        # as any operation's, so forward, its saved tensors and backward all live on the device; forward
        # then runs without the mode, as backward does (a tensor it makes on the wrong device fails
        # as it would on the device, and a torch.compile inside it traces no mode).
        raw = torch.autograd.Function.__dict__["apply"]
        self._apply = raw
        mode = self

        def apply(cls, *args, **kwargs):
            # without the mode: _move reads each tensor's own device (inside the mode, reading
            # x.device is itself an operation, which would move x and report the device)
            with _pop_mode_temporarily():
                args, kwargs = pytree.tree_map(mode._move, (args, kwargs))
                out = raw.__func__(cls, *args, **kwargs)
            pytree.tree_map(mode._mark, out)
            return out

        torch.autograd.Function.apply = classmethod(apply)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.autograd.Function.apply = self._apply
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _AS_IS:
            return func(*args, **kwargs)
        if _in_place(func, kwargs) and any(self._outside(x) for x in _written(args, kwargs)):
            name = getattr(func, "__name__", func)
            raise AssertionError(f"{name}: in place on a tensor from outside OnDevice")
        args, kwargs = pytree.tree_map(self._move, (args, kwargs))
        out = func(*args, **kwargs)
        pytree.tree_map(self._mark, out)
        return out

    def _outside(self, x) -> bool:
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return False
        made = self._made.get(id(x))
        return made is None or made() is not x

    def _mark(self, x):
        if isinstance(x, torch.Tensor):
            self._made[id(x)] = weakref.ref(x)
        return x

    def _move(self, x):
        if not self._outside(x):
            return x
        dtype = self.dtype if self.dtype is not None and x.is_floating_point() else x.dtype
        self.largest = max(self.largest, x.numel())
        return self._mark(x.to(self.device, dtype, copy=self.copy))


def _outcome(build, dtype, mode: OnDevice | None) -> dict | Exception:
    """The case's results and gradients (``test_default_device._run``), with its call inside
    ``mode``; or the error it raised (a refused dtype)."""
    call, grad_inputs = build(dtype)

    def inside():
        if mode is None:
            return call()
        with mode:
            return call()

    try:
        return _run(inside, grad_inputs)
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as err:
        return err


# ------------------------------------------------------------------------------------ comparing
def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _as_float64(value) -> torch.Tensor:
    return torch.as_tensor(value).detach().cpu().to(torch.float64)


def _is_float(value) -> bool:
    return isinstance(value, float) or (isinstance(value, torch.Tensor) and value.is_floating_point())


def _amplification(ref: dict, cpu32: dict) -> dict[str, float]:
    """Per result: max |cpu32 - ref| / (u32 s), at least 1 (``_tolerance``)."""
    out = {}
    for path, value in ref.items():
        if not _is_float(value) or path not in cpu32:
            continue
        r, c = _as_float64(value), _as_float64(cpu32[path])
        finite = torch.isfinite(r) & torch.isfinite(c)
        scale = max(1.0, float(r[finite].abs().max())) if bool(finite.any()) else 1.0
        err = float((c - r)[finite].abs().max()) if bool(finite.any()) else 0.0
        out[path] = max(1.0, err / (_unit_roundoff(torch.float32) * scale))
    return out


def _tolerance(ref: torch.Tensor, cpu: torch.Tensor, u: float, amplification: float, terms: int = 0) -> float:
    """``2 |cpu - ref| + (16 + n) A u s`` (module docstring): n bounds the length of a reduction
    (the largest input's elements), whose summation order a device chooses for itself; a sum of n
    terms of size s computed in another order differs by at most about n u s (Higham, the gamma_n
    bound), which the CPU's own error need not show (it may be exact where the device's is not)."""
    finite = torch.isfinite(ref) & torch.isfinite(cpu)
    if not bool(finite.any()):
        return 0.0
    scale = max(1.0, float(ref[finite].abs().max()))
    return 2 * float((cpu - ref)[finite].abs().max()) + (16 + terms) * amplification * u * scale


def _compare(ref: dict, cpu: dict, got: dict, dtype: torch.dtype, amplification: dict[str, float],
             device: str = DEVICE, terms: int = 0) -> None:
    """Every result of the run on ``device`` (``got``) against the float64 reference: floating ones
    within ``_tolerance`` with NaN and infinities where the CPU has them, others equal to the
    CPU's; results on ``device``. Gradients (``grad[i]``) are those of the case's CPU inputs: computed
    on the device and carried back by autograd through ``OnDevice``'s differentiable copies."""
    assert got.keys() == cpu.keys() == ref.keys()
    for path, value in got.items():
        expected = cpu[path]
        if isinstance(value, torch.Tensor):
            where = "cpu" if path.startswith("grad[") else torch.device(device).type
            assert value.device.type == where, f"{path} is on {value.device}"
            assert isinstance(expected, torch.Tensor) and value.shape == expected.shape, path
            assert value.dtype == expected.dtype, f"{path}: {value.dtype}, the CPU gives {expected.dtype}"
        if not _is_float(expected):
            if isinstance(value, torch.Tensor):
                value = value.cpu()
            assert torch.equal(value, expected) if isinstance(value, torch.Tensor) else value == expected, (
                f"{path}: {value!r} != {expected!r}"
            )
            continue
        g, c, r = _as_float64(value), _as_float64(expected), _as_float64(ref[path])
        for name, test in (("NaN", torch.isnan), ("inf", torch.isposinf), ("-inf", torch.isneginf)):
            assert torch.equal(test(g), test(c)), f"{path}: {name} where the CPU has none, or the reverse"
        result_dtype = value.dtype if isinstance(value, torch.Tensor) else dtype
        tol = _tolerance(r, c, _unit_roundoff(result_dtype), amplification.get(path, 1.0), terms)
        finite = torch.isfinite(g)
        err = float((g - r)[finite].abs().max()) if bool(finite.any()) else 0.0
        assert err <= tol, f"{path}: {err:.3g} from the float64 reference, tolerance {tol:.3g}"


CASE_PARAMS = [
    pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
    for name, (_, dtypes, _) in CASES.items()
    for dtype in (DTYPES if torch.float32 in dtypes else dtypes)
]


@on_device
@pytest.mark.parametrize(("name", "dtype"), CASE_PARAMS)
def test_every_public_function_on_the_device_matches_the_cpu_in_float64(name, dtype):
    _, dtypes, build = CASES[name]
    _check_on_device(build, dtypes, dtype)


@on_device
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", ["preset grpo", "preset gspo", "preset sapo", "kl k3, entropy",
                                  "behavior truncate", "exact kl", "float normalizer"])
def test_the_compiled_fast_path_on_the_device_matches_the_cpu_in_float64(name, dtype):
    """``fused_policy_loss`` compiled (Triton kernels on CUDA) on cases of the policy-loss family, as the
    test above (whose cases run its formulas op by op)."""
    variant, options = POLICY_CASES[name]
    _check_on_device(_policy_case(variant, loss=fused_policy_loss, **options), FLOATS, dtype)


def _check_on_device(build, dtypes, dtype) -> None:
    """The case ``build`` on the device against the same call on the CPU in float64 (``_compare``)."""
    cpu = _outcome(build, dtype, None)
    mover = OnDevice(DEVICE)
    got = _outcome(build, dtype, mover)
    if isinstance(cpu, Exception):  # the CPU refuses this dtype: the device gives the same error
        assert type(got) is type(cpu) and str(got) == str(cpu), (got, cpu)
        return
    assert not isinstance(got, Exception), "".join(traceback.format_exception(got))
    ref = _outcome(build, dtype, OnDevice("cpu", torch.float64))
    if isinstance(ref, ValueError):  # inputs valid only to their own precision (weights summing to 1 in
        ref = cpu                    # bfloat16): the CPU's result in that dtype is the reference
    measured = torch.float32 if torch.float32 in dtypes else dtype
    amplification = _amplification(
        _outcome(build, measured, OnDevice("cpu", torch.float64)), _outcome(build, measured, None)
    )
    _compare(ref, cpu, got, dtype, amplification, terms=mover.largest)


@pytest.mark.parametrize(("name", "dtype"), [p for p in CASE_PARAMS if p.values[1] != torch.bfloat16])
def test_on_device_is_transparent(name, dtype):
    """``OnDevice`` on the CPU, copying every outside tensor at every operation, gives the plain
    call's results and gradients bit for bit (so on a GPU only the device differs)."""
    _, _, build = CASES[name]
    plain = _outcome(build, dtype, None)
    copied = _outcome(build, dtype, OnDevice("cpu", copy=True))
    assert plain.keys() == copied.keys()
    for path, value in plain.items():
        other = copied[path]
        if isinstance(value, torch.Tensor):
            assert value.dtype == other.dtype and torch.equal(value, other), path
        else:
            nan = isinstance(value, float) and math.isnan(value) and math.isnan(other)
            assert value == other or nan, path


def test_a_custom_autograd_function_gets_its_inputs_on_the_device():
    """The mover hands a custom ``autograd.Function`` its CPU inputs on its device (here "meta", which
    any machine has), its forward runs without the mode, and its backward's gradient reaches the CPU
    input. (It once read each input's device inside its own mode, where that read is an operation that
    moves: every input looked moved already and reached forward on the CPU.)"""
    seen = []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append((x.device.type, torch.overrides._get_current_function_mode() is None))
            return 2 * x

        @staticmethod
        def backward(ctx, grad):
            return 2 * grad

    x = torch.ones(3, requires_grad=True)
    with OnDevice("meta"):
        y = Double.apply(x)
    assert seen == [("meta", True)] and y.device.type == "meta"
    with OnDevice("cpu", copy=True):
        y = Double.apply(x)
    y.sum().backward()
    assert seen[1] == ("cpu", True) and torch.equal(x.grad, torch.full((3,), 2.0))


def test_the_comparison_fails_on_a_wrong_result():
    """The tolerance (here 16 u32 = 9.5e-7) does not absorb an error of 1e-3 in a float32 result of
    scale 1, nor a wrong boolean; the right result passes."""
    ref = {"x": torch.tensor([1.0, 0.5], dtype=torch.float64), "b": torch.tensor([True])}
    cpu = {"x": torch.tensor([1.0, 0.5]), "b": torch.tensor([True])}
    wrong = {"x": torch.tensor([1.0, 0.5 + 1e-3]), "b": torch.tensor([True])}
    with pytest.raises(AssertionError, match="x: 0.001 from the float64 reference"):
        _compare(ref, cpu, wrong, torch.float32, {"x": 1.0}, "cpu")
    with pytest.raises(AssertionError, match="b: "):
        _compare(ref, cpu, {"x": cpu["x"], "b": torch.tensor([False])}, torch.float32, {"x": 1.0}, "cpu")
    with pytest.raises(AssertionError, match="x is on meta"):
        _compare(ref, cpu, {"x": cpu["x"].to("meta"), "b": cpu["b"]}, torch.float32, {"x": 1.0}, "cpu")
    _compare(ref, cpu, cpu, torch.float32, {"x": 1.0}, "cpu")


# ------------------------------------------------------------------------------------ the trainer
@on_device
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_trainer_steps_with_bf16_autocast(compile, monkeypatch):
    """Two RL steps on the device with bfloat16 autocast (``amp``; the CPU ignores it): finite
    metrics, the weights move and stay on the device, the forward passes compute in bfloat16, and
    the first micro-batch's log-probs equal the sampler's recomputed ones to 16 bfloat16 unit
    roundoffs (two forward passes, each rounding logits of a fresh tiny model, below 1, to
    bfloat16; compiled and eager kernels differ in their rounding)."""
    spy = PolicyLossSpy(monkeypatch)
    trainer = Trainer(tiny(device=DEVICE, amp=True, compile=compile, loss="dapo"))
    trainer.finish_warmup()
    dtypes = []
    trainer.model.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    for _ in range(2):
        metrics = trainer.rl_step()
        assert all(math.isfinite(metrics[k]) for k in ("loss", "entropy", "grad_norm")), metrics
    cuda = torch.device(DEVICE).type == "cuda"
    assert set(dtypes) == {torch.bfloat16 if cuda else torch.float32}
    params = list(trainer.model.parameters())
    assert all(p.device.type == torch.device(DEVICE).type for p in params)
    assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))
    first = spy.calls[0]
    m = first["mask"].bool()
    assert m.sum() > 0
    gap = (first["logp"] - first["old_logp"])[m].abs().max()
    assert gap <= 16 * _unit_roundoff(torch.bfloat16), float(gap)


# ------------------------------------------------------------------------------------ checkpoints
def _weights_equal(trainer: Trainer, state: dict) -> bool:
    return all(torch.equal(v.cpu(), state["model"][k]) for k, v in trainer.model.state_dict().items())


@on_device
@pytest.mark.parametrize("where", ["written on the device", "written on the cpu"])
def test_a_checkpoint_moves_between_the_cpu_and_the_device(where, tmp_path):
    """Written on one, it evaluates on the other with the same weights bit for bit; it resumes on
    a device of the type that sampled it, and elsewhere is refused in one line."""
    source, other = (DEVICE, "cpu") if where == "written on the device" else ("cpu", DEVICE)
    assert run_training(tiny(device=source, steps=1), tmp_path / "run", progress=False, plot=False) == 0
    path = tmp_path / "run" / "checkpoint.pt"
    state, config = load_run_state(path)
    result = evaluate_checkpoint(path, device=other)
    assert 0.0 <= result["eval_greedy_accuracy"] <= 1.0 and result["step"] == 1
    trainer = Trainer(dataclasses.replace(config, device=other))
    trainer.load_state_dict(state, rng=False)
    assert _weights_equal(trainer, state)
    assert run_training(None, resume=path, steps_override=2, progress=False, plot=False) == 0
    assert load_checkpoint(path)["step"] == 2
    if torch.device(source).type != torch.device(other).type:
        # the stored config names the device the run sampled on; the same state with the other one
        elsewhere = save_checkpoint(tmp_path / "elsewhere.pt", {**state, "config": {**state["config"],
                                                                                     "device": other}})
        with pytest.raises(RunError, match="^--resume: checkpoint: its sampling generator ran on "):
            run_training(None, tmp_path / "resumed", resume=elsewhere, progress=False, plot=False)


# ------------------------------------------------------------------------------------ the kit
@on_device  # not marked ``framework``: RL_ORACLE_REQUIRE_FRAMEWORKS=1 would fail its skip without CUDA
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_mode_of_an_installed_framework_passes_its_profile_on_the_device(framework):
    """``check_framework_mode(..., device=DEVICE)`` for every mode of every kind: the framework's
    code runs on the device and the expected values are computed in float64 there (a GPU's ``exp``
    rounds some ratios of ``on_boundary`` a unit in the last place off the CPU's), so each mode
    passes under its own profile as on the CPU. Skipped for a framework not drivable here."""
    driver = load_driver(framework)
    reason = driver.availability()
    if reason is not None:
        pytest.skip(f"{framework} is not drivable here: {reason}")
    failing = {}
    for mode in driver.all_modes():
        report = check_framework_mode(driver, mode, reference=False, device=DEVICE)
        if not report.ok:
            failing[(mode.kind, mode.name)] = report.render()
    assert not failing, "\n\n".join(failing.values())


# ------------------------------------------------------------------------------------ NCCL
@pytest.mark.distributed
@pytest.mark.skipif(DRY_RUN or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_rank_ddp_over_nccl_equals_the_full_batch_gradient(tmp_path):
    """tests/test_lm_distributed.py's check with NCCL, one GPU per rank, float32 (no autocast):
    1e-5 relative (about 100 float32 unit roundoffs: the ranks' micro-batches run other kernel
    shapes than the full batch)."""
    from tests.test_lm_distributed import check_two_ranks

    check_two_ranks(tmp_path, "cuda", rtol=1e-5)


def test_the_module_covers_every_case_of_the_default_device_test():
    assert {p.values[0] for p in CASE_PARAMS} == set(CASES)
