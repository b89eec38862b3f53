"""Where the kit runs code it did not write: the checked function, its adapter, a framework's loss,
the import of a user's module. Every such call goes through ``guarded`` (or ``call``), so that
nothing the user's code does can end, hang, mislead or corrupt the run:

* **Anything raised is a failure of that call.** ``SystemExit`` (``sys.exit``), a
  ``KeyboardInterrupt`` the code raises itself, ``GeneratorExit`` or any other ``BaseException``
  becomes a ``UserCodeFailure`` (an ``Exception``) whose message is one line; ``os._exit`` and
  ``os.abort`` are replaced for the duration of the call by functions that raise it instead (a C
  extension calling ``exit()`` itself is out of reach). Ordinary exceptions pass through unchanged:
  the checkers report them on their case.
* **Torch's global state is restored after every call**: grad mode, default dtype, default
  device, anomaly mode and the intra-op thread count, so a function that leaves
  ``torch.set_grad_enabled(False)`` on cannot break the kit's own expected values.
* **A time limit per call** (``time_limit``; ``refimpl check --timeout``, default
  ``DEFAULT_TIMEOUT`` seconds). On the main thread a ``SIGALRM`` timer interrupts Python code
  (a loop, ``time.sleep``, code between torch ops): the call fails in one line and the run goes on.
  Code stuck inside one C call cannot be interrupted in-process; where the command line asked for it
  (``hard_stop``), a watchdog thread then ends the process with one line and exit status 1 after
  the limit plus a grace (``HARD_STOP_GRACE``), instead of hanging forever. Off the main thread (or
  without ``SIGALRM``) only that watchdog applies.
* **Ctrl-C versus a KeyboardInterrupt of the code.** While a call runs, SIGINT is handled here: a
  Ctrl-C *received by the process* sets a flag and interrupts the call, and after the call
  ``KeyboardInterrupt`` is raised again to the kit's caller (``refimpl check`` prints one line and
  exits 130; pytest stops as usual), even if the user's code swallowed it. A ``KeyboardInterrupt``
  raised by the code without a signal is that call's failure.
* **Its standard output goes to standard error** (``sys.stdout`` and file descriptor 1), so what
  the code prints never mixes into the kit's report (``refimpl check --json``).
* **Progress** (``progress``): a line per case class on standard error, which ``refimpl check``
  turns on when standard error is a terminal and ``--json`` is off.

The settings (time limit, hard stop, progress) are module state set by ``configure`` (the command
line) or scoped by ``settings`` (tests); the Python API runs with the defaults (a 60 s limit, no
hard stop, no progress).
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import torch

__all__ = [
    "DEFAULT_TIMEOUT",
    "HARD_STOP_GRACE",
    "UserCodeFailure",
    "Settings",
    "configure",
    "settings",
    "current",
    "guarded",
    "call",
    "torch_state",
    "progress",
]

#: the default time limit of one call of the user's code, in seconds (generous: a loss call on the
#: kit's small cases takes milliseconds, a framework's first call a few seconds)
DEFAULT_TIMEOUT = 60.0
#: at most this many seconds past the time limit (at least 1 s, at most the limit itself) the hard
#: stop waits before it ends a process stuck in C code
HARD_STOP_GRACE = 5.0


class UserCodeFailure(Exception):
    """The user's code ended its call in a way that is not an ordinary exception (``sys.exit``, its
    own ``KeyboardInterrupt``, another ``BaseException``, ``os._exit``) or ran past the time
    limit; the message is one line."""


class _TimeLimit(BaseException):
    """Raised into the user's code by the SIGALRM handler (a BaseException, so that an ``except
    Exception`` of the code does not swallow it)."""


class _Exit(BaseException):
    """Raised by the stand-ins of ``os._exit`` / ``os.abort`` during a call."""


@dataclasses.dataclass
class Settings:
    """``timeout``: seconds per call (None: no limit); ``hard_stop``: end the process when a call
    is stuck in C code past the limit; ``progress``: a callable given one line per finished case
    class (None: quiet)."""

    timeout: float | None = DEFAULT_TIMEOUT
    hard_stop: bool = False
    progress: Callable[[str], None] | None = None


_settings = Settings()
_local = threading.local()  # depth of nested guarded calls in this thread


def current() -> Settings:
    """The settings in force."""
    return _settings


def configure(**changes) -> Settings:
    """Change the settings for the rest of the process (``refimpl check`` does); returns the
    previous ones."""
    global _settings
    previous = _settings
    _settings = dataclasses.replace(_settings, **changes)
    return previous


@contextlib.contextmanager
def settings(**changes) -> Iterator[Settings]:
    """The settings changed within a ``with`` block (tests; a script that wants a shorter limit)."""
    global _settings
    previous = configure(**changes)
    try:
        yield _settings
    finally:
        _settings = previous
        while _watchers:
            _watchers.pop().close()


# ------------------------------------------------------------------------------------------------
# torch's global state


def _device_context():
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    return getattr(holder, "device_context", None)


@contextlib.contextmanager
def torch_state() -> Iterator[None]:
    """Grad mode, default dtype, default device, anomaly mode and the thread count as they were
    before the block, whatever the block did to them."""
    grad, dtype, anomaly = torch.is_grad_enabled(), torch.get_default_dtype(), torch.is_anomaly_enabled()
    threads, device_context = torch.get_num_threads(), _device_context()
    device = torch.get_default_device()
    try:
        yield
    finally:
        if torch.is_grad_enabled() != grad:
            torch.set_grad_enabled(grad)
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        if torch.is_anomaly_enabled() != anomaly:
            torch.set_anomaly_enabled(anomaly)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if _device_context() is not device_context:
            torch.set_default_device(None if device_context is None else device)


# ------------------------------------------------------------------------------------------------
# the guard


def _describe(exc: BaseException) -> str:
    """One line for a BaseException that is not an Exception."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    text = " ".join(str(exc).split())
    return f"raised {type(exc).__name__}" + (f": {text}" if text else "")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Call:
    """The bookkeeping of one guarded call: signal handlers, timer, watchdog, flags."""

    def __init__(self, what: str, limit: float | None, hard_stop: bool):
        self.what, self.limit, self.hard_stop = what, limit, hard_stop
        self.pressed = self.expired = False
        self.saved: list[tuple[str, object]] = []

    def on_sigint(self, signum, frame):
        self.pressed = True
        raise KeyboardInterrupt

    def on_alarm(self, signum, frame):
        self.expired = True
        raise _TimeLimit

    def __enter__(self):
        main = _main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.saved.append(("int", signal.signal(signal.SIGINT, self.on_sigint)))
        if self.limit is not None and main and hasattr(signal, "SIGALRM"):
            self.saved.append(("alrm", signal.signal(signal.SIGALRM, self.on_alarm)))
            self.saved.append(("timer", (signal.setitimer(signal.ITIMER_REAL, self.limit), time.monotonic())))
        if self.limit is not None and self.hard_stop:
            _watcher().arm(self.limit + min(HARD_STOP_GRACE, max(1.0, self.limit)), self.limit, self.what)
        return self

    def __exit__(self, *exc):
        if self.limit is not None and self.hard_stop:
            faulthandler.cancel_dump_traceback_later()
        saved = dict(self.saved)
        if "alrm" in saved:
            signal.setitimer(signal.ITIMER_REAL, 0.0)  # this call's timer, before its handler goes
            signal.signal(signal.SIGALRM, saved["alrm"])
            (delay, interval), started = saved["timer"]
            if delay:  # a timer of the caller's (e.g. pytest-timeout): what is left of it
                left = max(delay - (time.monotonic() - started), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, left, interval)
        if "int" in saved:
            signal.signal(signal.SIGINT, saved["int"])
        return False


# The hard stop: ``faulthandler``'s watchdog is a C thread that needs no GIL (a Python thread would
# wait forever for the GIL that the stuck call holds); at the deadline it writes its dump into a pipe
# and ends the process with _exit(1). A small child process reads the pipe and turns the dump into
# one line on stderr naming the call.
_WATCHER_CODE = """
import sys
what = limit = ""
for line in sys.stdin:
    if line.startswith("call "):
        limit, _, what = line[5:].rstrip("\\n").partition(" ")
    elif line.startswith("Timeout ("):
        sys.stderr.write(
            f"refimpl check: FAIL: {what} did not return within the time limit of {limit} s "
            "(--timeout) and cannot be interrupted (stuck in compiled code): the check was stopped\\n")
        sys.stderr.flush()
        break
for line in sys.stdin:
    pass
"""


class _Watcher:
    """The child process of the hard stop and the pipe to it."""

    def __init__(self):
        read, write = os.pipe()
        self.process = subprocess.Popen([sys.executable, "-c", _WATCHER_CODE], stdin=read)
        os.close(read)
        self.pipe = os.fdopen(write, "w")

    def arm(self, after: float, limit: float, what: str) -> None:
        self.pipe.write(f"call {limit:g} {' '.join(what.split())}\n")
        self.pipe.flush()
        faulthandler.dump_traceback_later(after, exit=True, file=self.pipe)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.pipe.close()
        self.process.wait()


_watchers: list[_Watcher] = []


def _watcher() -> _Watcher:
    if not _watchers:
        _watchers.append(_Watcher())
    return _watchers[0]


def _raise_exit(*args):
    raise _Exit(f"called os._exit({args[0]!r})" if args else "called os.abort()")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """``sys.stdout`` and file descriptor 1 pointing at standard error during the block."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    saved_fd = None
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptors 1 / 2 (an embedded interpreter): Python's level only
        saved_fd = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def guarded(compute: Callable, what: str = "the function"):
    """``compute()`` run as the user's code (see the module docstring): its value; an ordinary
    exception passes through; any other ending, or the time limit, raises ``UserCodeFailure``
    naming ``what``; a Ctrl-C received meanwhile raises ``KeyboardInterrupt`` after the call.
    Nested calls (the kit's call of a case, the user's function inside it) are guarded once, at
    the outermost; the inner ones only restore torch's state."""
    depth = getattr(_local, "depth", 0)
    if depth:
        with torch_state():
            return compute()
    s = _settings
    _local.depth = 1
    exit_, abort = os._exit, os.abort
    guard = _Call(what, s.timeout, s.hard_stop)
    failure, returned, value = None, False, None
    try:
        with torch_state(), _stdout_to_stderr():
            os._exit, os.abort = _raise_exit, _raise_exit
            try:
                with guard:
                    value = compute()
                returned = True
            except _TimeLimit:
                failure = f"{what} did not return within the time limit of {s.timeout:g} s (--timeout)"
            except Exception:
                if guard.expired:  # the time limit, caught by the code and turned into an exception
                    failure = f"{what} did not return within the time limit of {s.timeout:g} s (--timeout)"
                elif not guard.pressed:
                    raise
            except _Exit as exc:
                failure = f"{what} {exc}"
            except BaseException as exc:  # noqa: BLE001 (sys.exit, its own KeyboardInterrupt, ...)
                if not guard.pressed:
                    failure = f"{what} {_describe(exc)}"
            finally:
                os._exit, os.abort = exit_, abort
    finally:
        _local.depth = 0
    if guard.pressed:
        raise KeyboardInterrupt
    if returned and not guard.expired:
        return value
    if failure is None:  # the code swallowed the time limit and returned
        failure = f"{what} did not return within the time limit of {s.timeout:g} s (--timeout)"
    raise UserCodeFailure(failure)


def call(fn: Callable, *args, what: str | None = None, **kwargs):
    """``fn(*args, **kwargs)`` through ``guarded`` (``what`` defaults to the function's name)."""
    name = what or getattr(fn, "__qualname__", type(fn).__name__)
    return guarded(lambda: fn(*args, **kwargs), name)


# ------------------------------------------------------------------------------------------------
# progress


def progress(items: list, class_of: Callable) -> Callable[[int], None]:
    """A callback ``done(i)`` to call after item ``i`` of ``items``: when the item ends its case
    class (the next item's class differs), one line goes to the configured progress writer
    (``[3/16] on_boundary: 6 cases, 0.4 s``). A no-op when progress is off."""
    writer = _settings.progress
    if writer is None or not items:
        return lambda i: None
    classes = [class_of(item) for item in items]
    order = list(dict.fromkeys(classes))
    state = {"start": time.monotonic(), "count": 0}

    def done(i: int) -> None:
        state["count"] += 1
        if i + 1 < len(classes) and classes[i + 1] == classes[i]:
            return
        now = time.monotonic()
        count, plural = state["count"], "s" * (state["count"] != 1)
        writer(f"[{order.index(classes[i]) + 1}/{len(order)}] {classes[i]}: {count} case{plural}, "
               f"{now - state['start']:.1f} s")
        state["start"], state["count"] = now, 0

    return done
