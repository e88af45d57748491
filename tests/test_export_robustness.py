"""The exporter at its seams: bad token ids and tokenizer files named clearly; --overwrite
through a symlink; disk full and too little free disk; an interrupted replacement never leaves
neither export; SIGTERM and Ctrl-C clean up without a traceback."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mla_export.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from mla_export.checkpoint.presets import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("robust") / "ckpt", "deepseek_v3", seed=3)


def _variant(ckpt, tmp_path, edit=None, tokenizer: bytes | None = None) -> Path:
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(ckpt, d)
    if edit:
        raw = json.loads((d / "config.json").read_text())
        edit(raw)
        (d / "config.json").write_text(json.dumps(raw))
    if tokenizer is not None:
        (d / "tokenizer.json").write_bytes(tokenizer)
    return d


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("edit,message", [
    (lambda r: r.__setitem__("eos_token_id", "</s>"), "eos_token_id must be an integer"),
    (lambda r: r.__setitem__("eos_token_id", [1, 10**6]), "eos_token_id 1000000 is outside the vocabulary"),
    (lambda r: r.__setitem__("bos_token_id", -1), "bos_token_id -1 is outside the vocabulary"),
])
def test_bad_special_token_ids_are_named(ckpt, tmp_path, capsys, edit, message):
    src = _variant(ckpt, tmp_path, edit)
    assert main(["export", str(src), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_garbage_tokenizer_json_is_named(ckpt, tmp_path, capsys):
    src = _variant(ckpt, tmp_path, tokenizer=b'{"version": "1.0", "model": 42}')
    assert main(["export", str(src), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json" in err and "not a tokenizer" in err


def test_overwrite_through_a_symlink(ckpt, tmp_path):
    real = tmp_path / "real"
    assert main(["export", str(ckpt), "-o", str(real), "-q"]) == 0
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = (real / "mla_graph.json").stat().st_mtime_ns
    assert main(["export", str(ckpt), "-o", str(link), "--overwrite", "-q", "--block-size", "8"]) == 0
    assert link.is_symlink() and json.loads((real / "mla_graph.json").read_text())["cache"]["block_size"] == 8
    assert (real / "mla_graph.json").stat().st_mtime_ns != before and _leftovers(tmp_path) == []


def test_disk_full_is_a_message(ckpt, tmp_path, capsys, monkeypatch):
    from mla_export.export import exporter

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(exporter, "copy_tokenizer_files", full)
    assert main(["export", str(ckpt), "-o", str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_free_disk_is_checked_first(ckpt, tmp_path, capsys, monkeypatch):
    import shutil

    from mla_export.export import exporter

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(exporter.shutil, "disk_usage", lambda p: usage._replace(free=1 << 10))
    assert main(["export", str(ckpt), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "is free" in capsys.readouterr().err
    assert _leftovers(tmp_path) == []


def test_interrupted_replacement_keeps_the_old_export(tmp_path, monkeypatch):
    from mla_export.export.safety import replace_dir

    old, new = tmp_path / "out", tmp_path / ".out.partial-1"
    old.mkdir(), new.mkdir()
    (old / "which").write_text("old"), (new / "which").write_text("new")
    real_rename = Path.rename

    def interrupted(self, target):
        if self == new:
            raise KeyboardInterrupt  # Ctrl-C between moving the old one aside and the new one in
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(new, old)
    assert (old / "which").read_text() == "old"
    monkeypatch.setattr(Path, "rename", real_rename)
    replace_dir(new, old)
    assert (old / "which").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signals_clean_up_without_a_traceback(ckpt, tmp_path, sig, code):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "mla_export.cli", "export", str(ckpt), "-o", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # start-up wait, not a timing threshold
    while not _leftovers(tmp_path):  # the temporary .out.partial-* directory exists: mid-export
        assert proc.poll() is None, "the export finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "nothing was written" in err
    assert _leftovers(tmp_path) == [] and not out.exists()
