"""Issue 36, cause 7: signals and races in `mla-export export`, with real processes.

- SIGINT or SIGTERM at a random moment (seeded) from the moment the command's handlers are in
  (the first thing `mla-export export` does) to past the end: either one line and 130/143 with
  nothing left behind, or exit 0 with a complete export in place (a signal after completion).
- Three exports started together to one new path without --overwrite: exactly one succeeds.
- A partial left by a SIGKILLed exporter is removed by the next export to that path; a partial
  whose recorded owner is alive, or that has no owner record, is left alone."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mla_export.formats.contract import load_contract

REPO = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("MLA_SIGNAL_RUNS", "6"))  # more: MLA_SIGNAL_RUNS=N


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from mla_export.checkpoint.presets import make_numpy_checkpoint  # no torch: a quick set-up

    return make_numpy_checkpoint(tmp_path_factory.mktemp("signals") / "ckpt", "deepseek_v3", seed=3)


def _export(ckpt, out, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mla_export.cli", "export", str(ckpt), "-o", str(out), "-q", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _caught(pid: int) -> int:
    """The process's caught-signal mask (/proc/PID/status SigCgt), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _handlers_in(proc: subprocess.Popen) -> float:
    """Wait until the exporter catches SIGTERM (Python itself does not: the command's handler is in)."""
    start = time.monotonic()
    while not _caught(proc.pid) & (1 << (signal.SIGTERM - 1)):
        assert proc.poll() is None, f"the export ended before its handlers were in: {proc.communicate()}"
        assert time.monotonic() - start < 60  # a start-up wait, not a timing threshold
        time.sleep(0.001)
    return time.monotonic()


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


class TestExportSignalsAndRaces:
    def test_a_signal_at_any_moment_ends_in_one_line_or_a_complete_export(self, ckpt, tmp_path):
        # How long an export takes here, so the random moments cover its start-up, work and end.
        out = tmp_path / "timing"
        proc = _export(ckpt, out)
        t0 = _handlers_in(proc)
        assert proc.wait(timeout=300) == 0, proc.communicate()
        duration = time.monotonic() - t0
        rng = random.Random(36)
        outcomes = []
        for run in range(RUNS):
            out = tmp_path / f"run{run}" / "out"
            out.parent.mkdir()
            sig = rng.choice([signal.SIGINT, signal.SIGTERM])
            delay = rng.uniform(0.0, duration * 1.15)  # a few land after the export is complete
            proc = _export(ckpt, out)
            t = _handlers_in(proc)
            time.sleep(max(0.0, t + delay - time.monotonic()))
            proc.send_signal(sig)
            stdout, stderr = proc.communicate(timeout=300)
            where = f"run {run}: {sig.name} {delay:.2f} s after the handlers were in (export {duration:.2f} s)"
            assert "Traceback" not in stderr, f"{where}:\n{stderr}"
            if proc.returncode == 0:  # it was complete: a valid export is in place
                load_contract(out)
                assert stdout.startswith("exported "), where
                outcomes.append("complete")
            else:
                assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], f"{where}: {proc.returncode} {stderr}"
                assert len(_lines(stderr)) == 1 and "nothing was written" in stderr, f"{where}:\n{stderr}"
                assert not out.exists(), where
                outcomes.append("interrupted")
            assert _leftovers(out.parent) == [], f"{where}: {_leftovers(out.parent)}"
        assert "interrupted" in outcomes, outcomes  # the seed reaches both outcomes

    def test_concurrent_exports_to_one_new_path_one_wins(self, ckpt, tmp_path):
        out = tmp_path / "out"
        procs = [_export(ckpt, out) for _ in range(3)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2, 2], results
        for code, _, err in results:
            assert "Traceback" not in err
            if code == 2:
                assert len(_lines(err)) == 1 and ("another `mla-export export`" in err or "is not empty" in err), err
        load_contract(out)
        assert _leftovers(tmp_path) == []

    def test_a_killed_exporters_partial_is_removed_by_the_next_export(self, ckpt, tmp_path):
        out = tmp_path / "out"
        proc = _export(ckpt, out)
        _handlers_in(proc)
        start = time.monotonic()
        while not any(p.is_dir() and p.name.startswith(".out.partial-") for p in tmp_path.iterdir()):
            assert proc.poll() is None, "the export finished before it could be killed"
            assert time.monotonic() - start < 60
            time.sleep(0.002)
        proc.kill()
        proc.wait()
        assert any(p.is_dir() and p.name.startswith(".out.partial-") for p in tmp_path.iterdir())
        # A partial of a live exporter (this test's own process as its recorded owner) and one without
        # a record are not the next export's to remove.
        live, unknown = tmp_path / ".out.partial-live", tmp_path / ".out.partial-unknown"
        live.mkdir(), unknown.mkdir()
        me = dict(pid=os.getpid(), boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                  start_time=int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19]),
                  host=socket.gethostname())
        (tmp_path / ".out.partial-live.owner").write_text(json.dumps(me))
        again = _export(ckpt, out)
        _, err = again.communicate(timeout=300)
        assert again.returncode == 0, err
        assert "removed .out.partial-" in err and "no longer running" in err
        load_contract(out)
        assert _leftovers(tmp_path) == [".out.partial-live", ".out.partial-live.owner", ".out.partial-unknown"]

    def test_an_old_export_cut_between_the_renames_is_put_back(self, ckpt, tmp_path, capsys):
        # SIGKILL after the old export was renamed aside and before the new one moved in leaves
        # no OUT_DIR, only `.out.old-*` with its (dead) owner's record: the next export restores it
        # first, so --overwrite is needed to replace it and the result is the new export.
        from mla_export.cli import main

        out = tmp_path / "out"
        assert main(["export", str(ckpt), "-o", str(out), "-q", "--block-size", "8"]) == 0
        aside = tmp_path / ".out.old-cut"
        out.rename(aside)
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        record = dict(pid=int(dead.stdout), boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                      start_time=0, host=socket.gethostname())
        (tmp_path / ".out.old-cut.owner").write_text(json.dumps(record))
        capsys.readouterr()
        assert main(["export", str(ckpt), "-o", str(out), "-q", "--block-size", "4"]) == 2
        err = capsys.readouterr().err
        assert "restored" in err and "is not empty" in err, err
        assert load_contract(out).cache["block_size"] == 8 and _leftovers(tmp_path) == []
        assert main(["export", str(ckpt), "-o", str(out), "-q", "--block-size", "4", "--overwrite"]) == 0
        assert load_contract(out).cache["block_size"] == 4 and _leftovers(tmp_path) == []

    def test_a_closed_stdout_after_the_export_is_not_a_failure(self, ckpt, tmp_path):
        # `mla-export export ... | head -1`: the summary cannot be written, the export is in place.
        out = tmp_path / "out"
        proc = _export(ckpt, out)
        proc.stdout.close()
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert _lines(err) == [f"mla-export export: Broken pipe after the export was complete; {out} is in place"]
        load_contract(out)
        assert _leftovers(tmp_path) == []


class TestHeldBlockDefersSignalsFromAnyThread:
    """Blocking SIGINT/SIGTERM (pthread_sigmask) covers the main thread only: when another thread
    (tqdm's monitor, a library's pool) takes the process-directed signal, Python still runs the
    handler in the main thread, inside the held block. CI once left `.OUT.partial-*.owner.PID`
    (write_owner's temporary) that way. The handler must keep the signal for the block's end."""

    def test_signal_inside_the_block_fires_at_its_end(self):
        import signal as sig

        from mla_export.export import signals as es

        with es.export_signals() as state:
            state.armed = True
            steps = []
            with pytest.raises(es.Terminated):
                with es.signals_held():
                    state.on_signal(sig.SIGTERM, None)  # what Python runs when another thread took it
                    steps.append("the held step finished")
            assert steps == ["the held step finished"] and state.fired

    def test_a_signal_inside_the_import_machinery_fires_just_after(self):
        """A signal that lands inside importlib's frames is not raised there (the exception could
        leave the import lock held, and the process hang at its next import: CI once saw an export
        finish and never exit); it is delivered again shortly and raises outside them."""
        import signal as sig
        import sys
        import time

        from mla_export.export import signals as es

        code = compile("def where():\n    return sys._getframe()\n", "<frozen importlib._bootstrap>", "exec")
        space = {"sys": sys}
        exec(code, space)
        inside = space["where"]()
        with es.export_signals() as state:
            state.armed = True
            state.on_signal(sig.SIGINT, inside)  # deferred: nothing raised here
            assert not state.raised
            with pytest.raises(KeyboardInterrupt):
                time.sleep(5)  # the re-delivered SIGINT arrives outside the import machinery
            assert state.raised and state.interrupted
            state.on_signal(sig.SIGINT, sys._getframe())  # raised once only

    def test_no_signal_after_completion(self):
        import signal as sig

        from mla_export.export import signals as es

        with es.export_signals() as state:
            state.armed = True
            with es.signals_held():
                state.on_signal(sig.SIGINT, None)
                es.mark_complete()
            assert state.interrupted and not state.raised
