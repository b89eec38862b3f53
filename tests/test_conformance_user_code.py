"""The kit under hostile user code (refimpl/conformance/user_code.py, issue 28 item 5) and the
plugin's unresolvable target (item 6): whatever the checked function does (``sys.exit``,
``os._exit``, its own ``KeyboardInterrupt``, a hang in Python or in compiled code, torch's global
state left changed, prints, a return value outside the contract), the check ends with a report or
one line, never silently and never with a traceback; a Ctrl-C ends ``refimpl check`` with one line
and exit 130. The time limits are tiny (0.5 s) so the file stays fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from refimpl.conformance import check_kl, check_loss
from refimpl.conformance.checks import SignatureError
from refimpl.losses import get_preset, policy_loss

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def dapo(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
    return policy_loss(logp, old_logp, advantages, mask, get_preset("dapo"), normalizer=normalizer)[0]


def k3(logp, ref_logp):
    log_r = ref_logp - logp
    r = torch.exp(log_r)
    return torch.where(torch.isposinf(log_r), r, r - log_r - 1)  # the limit +inf at log r = +inf


def on_half(action):
    """A DAPO loss that does ``action()`` on half-precision cases and is right elsewhere."""

    def loss(logp, *args, **kwargs):
        if logp.dtype in (torch.bfloat16, torch.float16):
            return action()
        return dapo(logp, *args, **kwargs)

    return loss


def _exit():
    sys.exit(0)


def _interrupt():
    raise KeyboardInterrupt


def _sleep():
    time.sleep(5)


CLASSES = ("inside_clip", "bf16")


@pytest.mark.parametrize(
    "action, words",
    [(_exit, "called sys.exit(0)"), (_interrupt, "raised KeyboardInterrupt")],
)
def test_an_exit_or_interrupt_of_the_function_fails_its_case_not_the_run(action, words):
    report = check_loss(on_half(action), "dapo", classes=CLASSES)
    assert report.case_class("inside_clip").ok and not report.case_class("bf16").ok
    errors = {r.error for r in report.results if r.case_class == "bf16"}
    assert len(errors) == 1 and words in errors.pop()


def test_a_hang_fails_its_case_within_the_time_limit():
    from refimpl.conformance import user_code

    started = time.monotonic()
    with user_code.settings(timeout=0.5):
        report = check_loss(on_half(_sleep), "dapo", classes=CLASSES)
    assert time.monotonic() - started < 4.5  # three bf16 cases, 0.5 s each (a sleep is 5 s)
    assert report.case_class("inside_clip").ok and not report.case_class("bf16").ok
    bf16 = [r for r in report.results if r.case_class == "bf16"]
    assert all("did not return within the time limit of 0.5 s" in r.error for r in bf16)


def test_torch_state_left_changed_is_restored_and_the_function_is_judged_on_its_values():
    def leaves_state_changed(*args, **kwargs):
        loss = dapo(*args, **kwargs)
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        return loss

    report = check_loss(leaves_state_changed, "dapo", classes=("inside_clip", "ragged"))
    assert report.ok, report.render()
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32

    def no_gradient(*args, **kwargs):
        torch.set_grad_enabled(False)
        return dapo(*args, **kwargs)

    # its loss has no graph: the gradient is zero, a failure of the gradient (not of the kit)
    report = check_loss(no_gradient, "dapo", classes=("outside_clip",))
    assert all(r.value_ok and not r.grad_ok for r in report.results)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize(
    "returned, words",
    [
        (lambda loss: (), "got an empty tuple"),
        (lambda loss: [loss, {}], "got list"),
        (lambda loss: ("loss", {}), "got a tuple whose first element is str"),
        (lambda loss: None, "got None"),
    ],
)
def test_the_loss_contract_is_strict(returned, words):
    def loss(*args, **kwargs):
        return returned(dapo(*args, **kwargs))

    with pytest.raises(SignatureError) as info:
        check_loss(loss, "dapo", classes=("inside_clip",))
    assert words in str(info.value) and "\n" not in str(info.value)
    # a tuple whose first element is the loss: any length
    assert check_loss(lambda *a, **k: (dapo(*a, **k), {}, 3), "dapo", classes=("inside_clip",)).ok


def test_a_kl_estimator_returning_a_non_tensor_fails_in_one_line():
    def sometimes_a_list(logp, ref_logp):
        return [0.0] if bool((ref_logp - logp).abs().max() > 10) else k3(logp, ref_logp)

    report = check_kl(sometimes_a_list, "k3", classes=None)
    failed = [r for r in report.results if not r.ok]
    assert failed and all(r.error.startswith("TypeError: returned a list, expected fn(logp") for r in failed)


def _write(tmp_path: Path, source: str) -> None:
    (tmp_path / "hostile.py").write_text(textwrap.dedent(source))


def _main(args: list[str]) -> int:
    from refimpl.conformance.cli import main

    return main(args)


def test_print_goes_to_stderr_and_json_stays_json(tmp_path, monkeypatch, capfd):
    _write(tmp_path, """
        import os
        import torch

        print("noise at import")

        def k3(logp, ref_logp):
            print("noise from the function")
            os.write(1, b"noise on descriptor 1\\n")
            log_r = ref_logp - logp
            r = torch.exp(log_r)
            return torch.where(torch.isposinf(log_r), r, r - log_r - 1)
        """)
    monkeypatch.chdir(tmp_path)
    assert _main(["check", "kl", "hostile:k3", "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["ok"] and "noise at import" in err and "noise on descriptor 1" in err


def test_progress_is_a_line_per_case_class_on_a_terminal_and_quiet_under_json(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert _main(["check", "kl", f"{__name__}:k3"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("refimpl check kl: [") and " case" in line for line in err)
    assert len(err) == len({line.split("]")[0] for line in err}) > 1  # one line per class
    assert _main(["check", "kl", f"{__name__}:k3", "--json"]) == 0
    assert capsys.readouterr().err == ""


def _refimpl(tmp_path: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "refimpl", "check", "loss", *args]
    return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def test_os_exit_and_a_hang_in_compiled_code_end_in_one_line(tmp_path):
    _write(tmp_path, """
        import os

        def exits(*args, **kwargs):
            os._exit(0)

        def stuck(*args, **kwargs):
            sum(range(10**15))  # one C call that never looks at signals
        """)
    exits = _refimpl(tmp_path, "hostile:exits", "--preset", "dapo")
    stuck = _refimpl(tmp_path, "hostile:stuck", "--preset", "dapo", "--timeout", "0.5")
    out, err = exits.communicate(timeout=300)
    assert exits.returncode == 2 and out == "" and err.strip().count("\n") == 0
    assert "exits called os._exit(0) on the plainest case" in err
    out, err = stuck.communicate(timeout=300)
    assert stuck.returncode == 1 and out == "" and err.strip().count("\n") == 0
    assert "stuck did not return within the time limit of 0.5 s" in err and "compiled code" in err


def test_ctrl_c_ends_the_check_in_one_line_with_130(tmp_path):
    _write(tmp_path, f"""
        import time
        from pathlib import Path

        def slow(*args, **kwargs):
            Path({str(tmp_path / "called")!r}).touch()
            time.sleep(30)
        """)
    # a terminal's Ctrl-C reaches a process whose SIGINT is not ignored; a test run in the background of
    # a non-interactive shell (CI's lanes, `cmd &`) inherits SIGINT ignored, which Python keeps: restore
    # the default in the child so that its Python installs its Ctrl-C handler
    process = _refimpl(tmp_path, "hostile:slow", "--preset", "dapo", start_new_session=True,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not (tmp_path / "called").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130 and out == ""
    assert err.strip() == "refimpl check loss: interrupted (Ctrl-C)"


def test_the_plugin_reports_an_unresolvable_target_as_one_collection_error(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_typo="""
        from refimpl.pytest_plugin import kl_tests, loss_tests

        test_dapo = loss_tests("tests.test_conformance_user_code:dapoo", "dapo")
        """)
    pytester.syspathinsert(ROOT)
    result = pytester.runpytest_inprocess("-p", "refimpl.pytest_plugin", "-p", "no:cacheprovider",
                                          "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(errors=1)
    errors = [line for line in result.stdout.lines if "rl-oracle: the target" in line]
    assert any("'tests.test_conformance_user_code:dapoo' cannot be resolved: AttributeError" in line
               for line in errors)
    assert "Traceback" not in result.stdout.str() and len(result.stdout.lines) < 20
