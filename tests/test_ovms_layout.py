"""`mla-export ovms`: the OpenVINO Model Server repository layout and config contents.

OVMS itself is not available here, so this checks what OVMS would read: the version directory
with the IR, config.json, the extension library and the command line in the README; and that
the IR in the repository runs with the *copied* library alone (a fresh process that imports
only openvino and numpy) and predicts the same next token as the runtime."""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys

import pytest


from mla_export.cli.commands import ovms


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


def run_cli(*argv) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    ovms.add_parser(sub)
    return ovms.run(parser.parse_args(["ovms", *map(str, argv)]))


def test_layout_and_config(model_dir, tmp_path):
    repo = tmp_path / "repo"
    assert run_cli(model_dir, "--repo", repo, "--name", "tiny-mla") == 0
    graph = json.loads((model_dir / "mla_graph.json").read_text())
    xml, binf = graph["files"]["openvino_xml"], graph["files"]["openvino_bin"]

    # The IR, byte for byte, in the version directory OVMS scans.
    vdir = repo / "tiny-mla" / "1"
    assert sorted(p.name for p in vdir.iterdir()) == sorted([xml, binf])
    assert filecmp.cmp(vdir / xml, model_dir / xml, shallow=False)
    assert filecmp.cmp(vdir / binf, model_dir / binf, shallow=False)
    # Nothing but version directories under the model's base path.
    assert [p.name for p in (repo / "tiny-mla").iterdir()] == ["1"]

    # The extension library, identical to the installed one.
    from mla_export import extension_path

    ext = repo / "extensions" / "libmla_export_ov.so"
    assert filecmp.cmp(ext, extension_path(), shallow=False)

    # config.json: exactly the OVMS model_config_list entry.
    config = json.loads((repo / "config.json").read_text())
    assert config == {"model_config_list": [{"config": {
        "name": "tiny-mla", "base_path": "tiny-mla", "target_device": "CPU",
        "plugin_config": {"INFERENCE_PRECISION_HINT": "bf16"}}}]}
    assert (repo / config["model_config_list"][0]["config"]["base_path"]).resolve() == (repo / "tiny-mla").resolve()

    # The command line: OVMS takes the extension only as --cpu_extension.
    want = (f"ovms --config_path {repo}/config.json --cpu_extension {repo}/extensions/libmla_export_ov.so "
            f"--port 9000 --rest_port 8000")
    readme = (repo / "README.md").read_text()
    assert want in readme
    assert ("docker run --rm -p 9000:9000 -p 8000:8000 -v \"$PWD\":/models:ro openvino/model_server:latest "
            "--config_path /models/config.json --cpu_extension /models/extensions/libmla_export_ov.so "
            "--port 9000 --rest_port 8000") in readme
    assert "not run" in readme  # says plainly that OVMS was not run
    script = repo / "run_ovms.sh"
    assert os.access(script, os.X_OK) and want in script.read_text()

    # Client metadata: the contract (listing only the IR) and the tokenizer.
    meta = repo / "metadata" / "tiny-mla"
    contract = json.loads((meta / "mla_graph.json").read_text())
    assert contract["model"] == graph["model"] and contract["cache"] == graph["cache"]
    assert contract["inputs"] == graph["inputs"]
    assert {k for k, v in contract["files"].items() if v} == {"openvino_xml", "openvino_bin"}
    assert filecmp.cmp(meta / "tokenizer.json", model_dir / "tokenizer.json", shallow=False)


def test_second_model_version_and_errors(model_dir, tmp_path):
    repo = tmp_path / "repo"
    assert run_cli(model_dir, "--repo", repo, "--name", "a") == 0
    assert run_cli(model_dir, "--repo", repo, "--name", "b", "--precision", "f32", "--version", "3") == 0
    config = json.loads((repo / "config.json").read_text())
    entries = {m["config"]["name"]: m["config"] for m in config["model_config_list"]}
    assert set(entries) == {"a", "b"}
    assert entries["b"]["plugin_config"] == {"INFERENCE_PRECISION_HINT": "f32"}
    assert (repo / "b" / "3").is_dir() and (repo / "a" / "1").is_dir()
    readme = (repo / "README.md").read_text()
    assert "a, b" in readme

    # An existing version is not overwritten without --force; nothing changes.
    before = (repo / "config.json").read_text()
    assert run_cli(model_dir, "--repo", repo, "--name", "a") == 2
    assert (repo / "config.json").read_text() == before
    assert run_cli(model_dir, "--repo", repo, "--name", "a", "--force") == 0
    assert len(json.loads((repo / "config.json").read_text())["model_config_list"]) == 2
    # No staging directory left behind.
    assert sorted(p.name for p in (repo / "a").iterdir()) == ["1"]

    # Bad inputs: exit code 2 and no repository written.
    bad = tmp_path / "bad"
    assert run_cli(tmp_path / "missing", "--repo", bad) == 2
    assert run_cli(model_dir, "--repo", bad, "--name", "../evil") == 2
    assert run_cli(model_dir, "--repo", bad, "--name", "extensions") == 2
    assert run_cli(model_dir, "--repo", bad, "--version", "0") == 2
    assert not bad.exists()


def test_broken_export_is_refused(model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    graph = json.loads((model_dir / "mla_graph.json").read_text())
    for name in os.listdir(model_dir):
        if name != graph["files"]["openvino_bin"]:  # the weights are missing
            os.link(model_dir / name, broken / name)
    assert run_cli(broken, "--repo", tmp_path / "r") == 2
    assert not (tmp_path / "r").exists()


_RUN_IR = r"""
import json, sys
import numpy as np
import openvino as ov
repo, name, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
assert "mla_export" not in sys.modules
cfg = json.load(open(f"{repo}/config.json"))["model_config_list"][0]["config"]
meta = json.load(open(f"{repo}/metadata/{name}/mla_graph.json"))
core = ov.Core()
core.add_extension(f"{repo}/extensions/libmla_export_ov.so")  # what --cpu_extension does
model = core.read_model(f"{repo}/{cfg['base_path']}/1/{meta['files']['openvino_xml']}")
compiled = core.compile_model(model, cfg["target_device"], {"INFERENCE_PRECISION_HINT": "f32"})
T, bs = len(ids), meta["cache"]["block_size"]
nb = -(-T // bs) + 1
feeds = {"input_ids": np.array(ids, np.int32), "positions": np.arange(T, dtype=np.int32),
         "slot_mapping": np.arange(T, dtype=np.int32), "query_start_loc": np.array([0, T], np.int32),
         "seq_lens": np.array([T], np.int32), "block_tables": np.arange(nb, dtype=np.int32)[None],
         "logits_indices": np.array([T - 1], np.int32)}
np_dtype = {"u8": np.uint8, "f32": np.float32}
for spec in meta["inputs"]:
    if spec["name"].startswith("kv_cache."):
        feeds[spec["name"]] = np.zeros((nb, bs, spec["shape"][2]), np_dtype[spec["dtype"]])
logits = compiled(feeds)["logits"]
print(json.dumps({"argmax": int(np.argmax(logits[0])), "finite": bool(np.isfinite(logits).all()),
                  "shape": list(logits.shape)}))
"""


def test_repository_ir_runs_with_the_copied_extension(model_dir, tmp_path):
    from mla_export import LLM

    repo = tmp_path / "repo"
    assert run_cli(model_dir, "--repo", repo, "--name", "tiny") == 0
    llm = LLM(model_dir, precision="f32")
    prompt = "The quick brown fox jumps over the lazy dog. A paged cache keeps"
    [want] = llm.generate([prompt], max_tokens=1, temperature=0.0)
    proc = subprocess.run([sys.executable, "-c", _RUN_IR, str(repo), "tiny", json.dumps(want.prompt_token_ids)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    vocab = json.loads((model_dir / "mla_graph.json").read_text())["model"]["vocab_size"]
    assert got["finite"] and got["shape"] == [1, vocab]
    assert got["argmax"] == want.token_ids[0]


def test_mtp_draft_is_not_listed_where_it_is_not_laid_out(tmp_path):
    """An export with an MTP draft (`--preset tiny-mtp`): the repository holds the main IR only, so
    its metadata contract lists no draft (it listed the export's draft files, which a client would
    not find there) and the README says why and what runs it."""
    from mla_export.cli.main import main as cli_main
    from mla_export.formats.contract import load_contract

    out = tmp_path / "mtp_export"
    assert cli_main(["export", "--preset", "tiny-mtp", "-o", str(out), "--format", "openvino"]) == 0
    assert load_contract(out).raw["mtp"] is not None  # the export has a draft
    repo = tmp_path / "repo"
    assert run_cli(out, "--repo", repo, "--name", "m") == 0
    meta = json.loads((repo / "metadata" / "m" / "mla_graph.json").read_text())
    assert meta["mtp"] is None
    assert not any("mtp" in p.name for p in repo.rglob("*"))
    assert "MTP draft graph (speculative decoding) is not in this repository" in (repo / "README.md").read_text()
