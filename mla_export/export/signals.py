"""SIGINT and SIGTERM in `mla-export export`, at every moment (a light module: the command
installs the handlers before anything slow is imported).

While the export works, the first SIGINT or SIGTERM raises KeyboardInterrupt / Terminated in the
main thread, so the `except BaseException` clean-ups run; the steps that must not be cut in half
(naming the partial directory, taking the output lock, the renames that put the export in place,
removing a partial) run with both signals blocked (`signals_held`). Once the export is in place
(`mark_complete`, called by export/safety.commit) a signal is only recorded: the command still
exits 0, because the export it was asked for exists. A second signal never interrupts the
clean-up of the first. Leaving the block of the process's own command sets both signals to
ignored: the outcome is decided and printed, and the interpreter's teardown (seconds with torch
loaded) must not turn it into -2/-15 (Python restores the default action of a signal it handled,
not of one it ignores)."""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["export_signals", "install_first", "signals_held", "mark_complete", "Terminated", "SignalState"]

_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Terminated(BaseException):
    """SIGTERM, raised where the process was, so `finally`/`except BaseException` clean-ups run."""


class SignalState:
    def __init__(self):
        self.first: int | None = None  # the first signal that arrived (SIGINT or SIGTERM)
        self.armed = False  # inside the work: the first signal raises
        self.raised = False
        self.complete = False  # the export is in place: signals are only recorded
        self.held = 0  # inside signals_held: a signal is kept for the block's end
        self.pending: int | None = None

    @property
    def fired(self) -> bool:  # SIGTERM came first
        return self.first == signal.SIGTERM

    @property
    def interrupted(self) -> bool:  # SIGINT (Ctrl-C) came first
        return self.first == signal.SIGINT

    def on_signal(self, signum, frame):
        if self.first is None:
            self.first = signum
        if self.held:
            # Blocking the signals (pthread_sigmask) covers the main thread only: another thread
            # (a library's pool) may take a process-directed signal, and Python then runs this
            # handler in the main thread anyway, inside the block. So the block defers it here too.
            self.pending = self.pending or signum
            return
        if self.armed and not self.complete and not self.raised and _in_import_machinery(frame):
            # Raised there, the exception can land between the import machinery taking its global
            # lock and the `try` that releases it (importlib's module-lock weakref callback): it is
            # swallowed ("Exception ignored in ... _get_module_lock.<locals>.cb"), the lock stays
            # held and the process hangs at its next import (CI: an export that finished, then
            # never exited). The same signal is delivered again shortly, outside it.
            _redeliver(signum)
            return
        self.fire(signum)

    def fire(self, signum):
        if self.armed and not self.complete and not self.raised:
            self.raised = True
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _in_import_machinery(frame) -> bool:
    """Whether the interrupted code is inside importlib's own frames (frozen bootstrap modules)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int, delay: float = 0.01) -> None:
    """Send signum to the main thread again after `delay` seconds (from a daemon thread: the
    handler runs in the main thread, at its next bytecode outside whatever it is in then)."""
    main = threading.main_thread().ident

    def again():
        with contextlib.suppress(OSError):  # the main thread (the process) ended meanwhile
            signal.pthread_kill(main, signum)

    timer = threading.Timer(delay, again)
    timer.daemon = True
    timer.start()


_ACTIVE: SignalState | None = None


def install_first() -> None:
    """For the process's own `mla-export export` (cli.main, before it parses anything): the
    handlers from the first moment; `export_signals` then takes this state over. A signal before
    the work starts is recorded and acted on when it starts."""
    global _ACTIVE
    if threading.current_thread() is threading.main_thread() and _ACTIVE is None:
        state = SignalState()
        for s in _SIGNALS:
            signal.signal(s, state.on_signal)
        _ACTIVE = state


@contextlib.contextmanager
def export_signals(final: bool = False):
    """Install the export's SIGINT/SIGTERM handlers (main thread only; elsewhere a state that never
    fires). The state's flags stay set afterwards: a library may turn the exception into one of its
    own (safetensors was seen to raise a ValueError), so callers check them. final: this is the
    process's own command; on leaving, both signals are ignored for the rest of its life."""
    global _ACTIVE
    if final and _ACTIVE is not None:  # installed by install_first: the process's own
        try:
            yield _ACTIVE
        finally:
            for s in _SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        return
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    old = {s: signal.signal(s, state.on_signal) for s in _SIGNALS}
    previous, _ACTIVE = _ACTIVE, state
    try:
        yield state
    finally:
        _ACTIVE = previous
        for s, handler in old.items():
            signal.signal(s, signal.SIG_IGN if final else handler)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM blocked inside (delivered when it ends): for steps that must not be cut."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _ACTIVE
    if state is not None:
        state.held += 1
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal blocked until now is handled here
        if state is not None:
            state.held -= 1
            if state.held == 0 and state.pending is not None:
                signum, state.pending = state.pending, None
                state.fire(signum)  # one that another thread took, kept by on_signal


def mark_complete() -> None:
    """The export is in place: from now on the running command's signals are only recorded."""
    if _ACTIVE is not None:
        _ACTIVE.complete = True

