"""`mla-export bench` must not mislead (issue 37): a run that measured nothing exits non-zero;
--quick fits the model's context; an export is compared only with the checkpoint it was made
from; a missing peer's reason is whole and names a command a wheel install has (the set-up
scripts ship in the package); the missing-matplotlib line names the [bench] extra.
Real tiny checkpoints and exports (numpy random weights), system 'ours' only: no peers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mla_export
from mla_export.bench import common, peers, setup_peers
from mla_export.cli import main
from mla_export.checkpoint.presets import make_numpy_checkpoint


@pytest.fixture(scope="module")
def ckpt_and_export(tmp_path_factory):
    """A tiny checkpoint (context 512) and its export, made with the CLI."""
    root = tmp_path_factory.mktemp("bench_mislead")
    ckpt = make_numpy_checkpoint(root / "ckpt", "deepseek_v3", seed=5)
    out = root / "export"
    assert main(["export", str(ckpt), "-o", str(out), "-q"]) == 0
    return ckpt, out


def bench(tmp_path, *args) -> int:
    return main(["bench", *args, "--out-dir", str(tmp_path / "res"), "--work-dir", str(tmp_path / "work"),
                 "--mem-wait", "0", "--threads", "1", "--no-bandwidth"])


class TestQuickFitsTheContext:
    """--quick used a 1024-token prompt whatever the model: on the tiny export (context 512) every
    run failed inside the worker ('more than the model's context')."""

    def test_quick_on_a_short_context_model_measures(self, ckpt_and_export, tmp_path):
        _, export = ckpt_and_export
        assert bench(tmp_path, "--export-dir", str(export), "--systems", "ours", "--quick", "--batches", "1",
                     "--new-tokens", "4") == 0
        doc = json.loads((tmp_path / "res/e2e.json").read_text())
        assert doc["workload"]["prompt_lens"] == [512 - 4]
        (r,) = doc["results"]
        assert r["ok"], r.get("error")
        assert r["decode_tok_s"] > 0

    def test_a_prompt_longer_than_the_context_is_refused_before_anything_runs(self, ckpt_and_export, tmp_path,
                                                                              capsys):
        _, export = ckpt_and_export
        assert bench(tmp_path, "--export-dir", str(export), "--systems", "ours", "--prompt-lens", "16,1024",
                     "--batches", "1", "--new-tokens", "4") == 2
        err = capsys.readouterr().err
        assert "--prompt-lens 1024" in err and "context (512 tokens" in err and "at most 508 tokens" in err
        assert not (tmp_path / "res").exists() and not (tmp_path / "work").exists()


class TestNothingMeasuredExitsNonZero:
    """A run whose every system failed or was not available wrote its tables and exited 0."""

    def test_every_run_failed(self, ckpt_and_export, tmp_path, capsys):
        _, export = ckpt_and_export
        # a worker cannot load the engine in 0.05 s: the run is killed, a real failure
        assert bench(tmp_path, "--export-dir", str(export), "--systems", "ours", "--prompt-lens", "8",
                     "--batches", "1", "--new-tokens", "2", "--timeout", "0.05") == 1
        err = capsys.readouterr().err
        assert "nothing was measured" in err and "  ours: exit -9: timeout after 0.05 s" in err
        assert (tmp_path / "res/e2e.json").is_file()  # the record is written all the same
        md = (tmp_path / "res/e2e.md").read_text()
        assert "| ours | 8 | 1 | failed: exit -9: timeout after 0.05 s |" in md

    def test_every_system_not_available(self, ckpt_and_export, tmp_path, capsys):
        ckpt, _ = ckpt_and_export
        assert bench(tmp_path, "--checkpoint", str(ckpt), "--systems", "llamacpp-Q8_0", "--prompt-lens", "8",
                     "--batches", "1", "--llamacpp-dir", str(tmp_path / "no-llamacpp")) == 1
        assert "llamacpp-Q8_0: llama.cpp peer not found" in capsys.readouterr().err

    def test_ik_system_not_available_names_its_peer(self, ckpt_and_export, tmp_path, capsys):
        ckpt, _ = ckpt_and_export
        assert bench(tmp_path, "--checkpoint", str(ckpt), "--systems", "ik-Q8_0", "--prompt-lens", "8",
                     "--batches", "1", "--ik-dir", str(tmp_path / "no-ik")) == 1
        err = capsys.readouterr().err
        assert "ik-Q8_0: ik_llama.cpp peer not found" in err and "setup-peers ik_llamacpp" in err

    def test_one_system_measured_is_success(self, ckpt_and_export, tmp_path):
        ckpt, export = ckpt_and_export
        assert bench(tmp_path, "--export-dir", str(export), "--checkpoint", str(ckpt), "--systems",
                     "ours,llamacpp-Q8_0", "--prompt-lens", "8", "--batches", "1", "--new-tokens", "2",
                     "--llamacpp-dir", str(tmp_path / "no-llamacpp")) == 0


class TestExportAndCheckpointMustMatch:
    """--export-dir with peers silently made a 3.2 GB v2lite checkpoint and compared ours (one model)
    with peers running another; a --checkpoint of another model was not checked either."""

    def test_peers_without_a_checkpoint_are_refused_naming_the_exports_source(self, ckpt_and_export, tmp_path,
                                                                                capsys):
        ckpt, export = ckpt_and_export
        assert bench(tmp_path, "--export-dir", str(export), "--systems", "ours,llamacpp-Q8_0,transformers") == 2
        err = capsys.readouterr().err
        assert f"--export-dir {export} runs as system 'ours' only; llamacpp-Q8_0, transformers" in err
        assert f"pass --checkpoint {ckpt.resolve()}" in err
        assert not (tmp_path / "work").exists()  # no checkpoint was made

    def test_another_models_checkpoint_is_refused_naming_both(self, ckpt_and_export, tmp_path, capsys):
        _, export = ckpt_and_export
        other = make_numpy_checkpoint(tmp_path / "other", "deepseek_v3", seed=5, num_hidden_layers=2)
        assert bench(tmp_path, "--export-dir", str(export), "--checkpoint", str(other), "--systems",
                     "ours,transformers", "--prompt-lens", "8") == 2
        err = capsys.readouterr().err
        assert f"--export-dir {export} is not a model of --checkpoint {other}" in err
        assert "num_hidden_layers 3 vs 2" in err

    def test_same_dimensions_other_checkpoint_is_refused(self, ckpt_and_export, tmp_path, capsys):
        ckpt, export = ckpt_and_export
        other = tmp_path / "same-dims"
        shutil.copytree(ckpt, other)
        cfg = json.loads((other / "config.json").read_text())
        cfg["initializer_range"] = 0.5  # another checkpoint of the same shape
        (other / "config.json").write_text(json.dumps(cfg))
        assert bench(tmp_path, "--export-dir", str(export), "--checkpoint", str(other), "--systems", "ours",
                     "--prompt-lens", "8") == 2
        err = capsys.readouterr().err
        assert f"was exported from {ckpt.resolve()}, not from --checkpoint {other}" in err

    def test_a_copy_of_the_source_checkpoint_is_accepted_and_recorded(self, ckpt_and_export, tmp_path):
        ckpt, export = ckpt_and_export
        copy = tmp_path / "copy"
        shutil.copytree(ckpt, copy)
        assert bench(tmp_path, "--export-dir", str(export), "--checkpoint", str(copy), "--systems", "ours",
                     "--prompt-lens", "8", "--batches", "1", "--new-tokens", "2") == 0
        doc = json.loads((tmp_path / "res/e2e.json").read_text())
        assert doc["workload"]["export_vs_checkpoint"] == (
            f"{export} was exported from {ckpt.resolve()}, the checkpoint the other systems run")


class TestPeerReasonsAreWholeAndActionable:
    """'not available' reasons were cut at 140 characters in the table (mid-word), stderr tails at
    400 characters from the end, and they pointed at tools/peers scripts a wheel does not have."""

    def test_missing_peers_name_the_setup_command(self, tmp_path, monkeypatch):
        monkeypatch.delenv("MLA_LLAMACPP_PEER", raising=False)
        _, why = peers.llamacpp_dir(str(tmp_path / "nowhere"))
        assert why.endswith("set it up with `mla-export bench setup-peers llamacpp`, or pass --llamacpp-dir DIR")
        _, why = peers.ik_dir(str(tmp_path / "nowhere"))
        assert why.endswith("set it up with `mla-export bench setup-peers ik_llamacpp`, or pass --ik-dir DIR")
        _, why = peers.vllm_python(str(tmp_path / "nowhere/python"))
        assert "`mla-export bench setup-peers vllm`" in why
        _, why = peers.optimum_python(str(tmp_path / "nowhere/python"))
        assert "`mla-export bench setup-peers optimum`" in why
        assert "tools/peers" not in why

    def test_the_table_holds_the_whole_reason(self, ckpt_and_export, tmp_path):
        ckpt, _ = ckpt_and_export
        deep = tmp_path / ("a-long-directory-name-" * 8) / "llamacpp"
        bench(tmp_path, "--checkpoint", str(ckpt), "--systems", "llamacpp-Q8_0", "--prompt-lens", "8",
              "--batches", "1", "--llamacpp-dir", str(deep))
        doc = json.loads((tmp_path / "res/e2e.json").read_text())
        reason = doc["results"][0]["not_available"]
        assert len(reason) > 140 and reason.endswith("--llamacpp-dir DIR")
        assert f"not available: {reason} |" in (tmp_path / "res/e2e.md").read_text()

    def test_error_tails_keep_whole_lines_and_words(self):
        text = "noise\n" + "first line\n" + "second line\n" + "word " * 200 + "end"
        tail = common.error_tail(text, limit=100)
        assert tail.startswith("... word") and tail.endswith("word end") and len(tail) <= 104
        assert common.error_tail("a\nb\nc\nd") == "b | c | d"
        assert common.error_tail("x" * 50 + "\n" + "y" * 30, limit=40) == "y" * 30


class TestPeerScriptsShipInThePackage:
    """The set-up scripts were in tools/peers, which a wheel install does not have."""

    def test_every_script_is_package_data_and_parses(self):
        pkg = Path(mla_export.__file__).resolve().parent
        for name in setup_peers.PEERS:
            script = setup_peers.script_path(name)
            assert script.is_file() and pkg in script.parents, script
            assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
        # what the scripts and the runs use besides themselves
        for extra in ("llamacpp/convert.py", "llamacpp/make_tokenizer.py", "llamacpp/build_llama_server.sh",
                      "optimum/make_and_export.py", "vllm/vllm_engine_run.py"):
            assert (setup_peers.SCRIPTS / extra).is_file(), extra
        assert peers.vllm_script(None)[0] == str(setup_peers.SCRIPTS / "vllm/vllm_engine_run.py")
        assert peers.optimum_export_script() == setup_peers.SCRIPTS / "optimum/make_and_export.py"

    def test_setup_peers_command(self, tmp_path):
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "bench", "setup-peers", "all", "--print-only"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        for name in setup_peers.PEERS:
            assert f"bash {setup_peers.script_path(name)} {Path.home() / setup_peers.PEERS[name].default_dir}" \
                in proc.stdout
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "bench", "setup-peers", "vllm", "optimum",
                               "--dir", str(tmp_path)], capture_output=True, text=True)
        assert proc.returncode == 2 and "--dir takes one peer at a time" in proc.stderr


class TestMissingMatplotlibNamesTheExtra:
    """'no plot: ModuleNotFoundError: No module named matplotlib' did not say how to get it."""

    def test_the_line_names_the_bench_extra(self, tmp_path, monkeypatch, capsys):
        from mla_export.bench.run import write_outputs

        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
        doc = {"schema_version": 2, "workload": {"model_config": {}}, "results": [], "aggregate": [],
               "summary": {}}
        monkeypatch.setattr("mla_export.bench.run.markdown", lambda d: "table\n")
        write_outputs(doc, tmp_path)
        err = capsys.readouterr().err
        assert "no plot (e2e_decode.png)" in err and "pip install 'mla-export[bench]'" in err
        assert (tmp_path / "e2e.json").is_file() and (tmp_path / "e2e.md").read_text() == "table\n"


class TestPeerOutputNotUtf8:
    """ik_llama.cpp's log printed a random checkpoint's token text cut inside a UTF-8 character: the
    strict decode killed the reader thread, the output was lost and the run was reported as
    'failed ... exit 0' with nothing to say why. Bytes that do not decode become U+FFFD."""

    CMD = [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'tok \\xef\\x28 RESULT'); "
           "sys.stderr.buffer.write(b'\\xff err')"]

    def test_sh_rss_keeps_the_output(self):
        rc, out, err, rss = common.sh_rss(self.CMD, timeout=60)
        assert rc == 0 and out == "tok \ufffd( RESULT" and err == "\ufffd err" and rss > 0

    def test_sh_keeps_the_output(self):
        assert common.sh(self.CMD, timeout=60) == (0, "tok \ufffd( RESULT", "\ufffd err")
