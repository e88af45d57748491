"""`mla-export bench` reports each run's efficiency (issue 34): a plain multi-thread read's bandwidth
right before and after every run, the weight bytes a batch-1 decode token reads, and bytes/token x
tok/s / that bandwidth, in e2e.json, e2e.md and the console. Batch-1 decode follows the host's
memory bandwidth, which other tenants move: tok/s alone does not compare rounds.

The bytes per token of our exports (computed from config.json and the contract) are checked
against a hand count over the constants the IR actually stores; the GGUF count against a GGUF
written here tensor by tensor with ggml's block sizes. Real tiny exports, no peers, no real
benchmark (a 64 MiB read, a 16-token prompt)."""

from __future__ import annotations

import json
import struct
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from mla_export.bench.bandwidth import read_gbps
from mla_export.bench.bytes_per_token import Unknown, export_bytes_per_token, gguf_bytes_per_token
from mla_export.cli import main


@pytest.fixture(scope="module")
def tiny_exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_eff")
    made = {}
    for tag, extra in (("bf16", ["--weight-format", "bf16"]), ("int8", ["--weight-format", "int8"]),
                       ("int4", ["--weight-format", "int4"]),
                       ("int4-all-g32", ["--weight-format", "int4", "--all-layers", "--group-size", "32"]),
                       ("fp8", ["--weight-format", "fp8"])):
        out = root / tag
        assert main(["export", "--preset", "tiny", "-o", str(out), "-q", *extra]) == 0
        made[tag] = out
    return made


def ir_hand_count(export_dir: Path) -> float:
    """What a batch-1 decode token reads, summed over the IR's stored constants by name: each
    routed expert tensor (stacked or per expert) top-k / n_routed of it, the embedding table and the
    RoPE tables one row, every other weight (matrices, scales, zero points, norms, routers) whole."""
    cfg = json.loads((export_dir / "config.json").read_text())
    total = 0.0
    for layer in ET.parse(export_dir / "openvino_model.xml").getroot().iter("layer"):
        if layer.get("type") != "Const":
            continue
        name, size = layer.get("name"), int(layer.find("data").get("size"))
        if name.startswith("model.embed_tokens."):
            total += size / cfg["vocab_size"]
        elif name in ("rope.cos", "rope.sin"):  # [positions the export holds, rope dims]
            total += size / int(layer.find("data").get("shape").split(",")[0])
        elif ".mlp.experts." in name:
            total += size * cfg["num_experts_per_tok"] / cfg["n_routed_experts"]
        elif name.startswith(("model.", "lm_head.")):
            total += size
        else:  # the graph's own small constants (shapes, axes): not weights
            assert size <= 64, name
    return total


class TestReadBandwidth:
    """The plain read the bench runs around every system: positive GB/s, on the threads asked."""

    def test_positive_on_the_requested_threads(self):
        reads = []  # (thread, elements) of each reduction a reader thread runs

        def profile(frame, event, arg):
            if event == "c_call" and arg == np.maximum.reduce and threading.current_thread() is not main:
                reads.append((threading.get_ident(), frame.f_locals["self"]._args[0].size))

        main = threading.current_thread()
        threading.setprofile(profile)
        try:
            gbps = read_gbps(threads=3, passes=2, size_mib=64)
        finally:
            threading.setprofile(None)
        assert gbps > 0.1
        assert len(reads) == 3 * 2  # a reader thread per part, each pass
        assert sum(n for _, n in reads) == 2 * (64 << 20) // 4  # together they read the whole buffer each pass

    @pytest.mark.parametrize("kw", [{"threads": 0}, {"passes": 0}, {"size_mib": -1}, {"threads": 1.5}])
    def test_bad_arguments_name_themselves(self, kw):
        with pytest.raises(ValueError, match=next(iter(kw))):
            read_gbps(**kw)


class TestOurBytesPerToken:
    """export_bytes_per_token works from config.json and the contract only; the IR's constants say
    what the export really stores."""

    @pytest.mark.parametrize("tag", ["bf16", "int8", "int4", "int4-all-g32", "fp8"])
    def test_matches_the_constants_the_ir_stores(self, tiny_exports, tag):
        got = export_bytes_per_token(tiny_exports[tag])
        assert got["bytes"] == pytest.approx(ir_hand_count(tiny_exports[tag]), abs=1)
        assert sum(got["parts"].values()) == pytest.approx(got["bytes"], abs=len(got["parts"]))

    def test_formats_order_as_their_bits(self, tiny_exports):
        b = {t: export_bytes_per_token(d)["bytes"] for t, d in tiny_exports.items()}
        assert b["int4-all-g32"] < b["int4"] < b["int8"] < b["bf16"]

    def test_a_mixed_int4_export_counts_its_recorded_plan(self, tiny_exports, tmp_path):
        """--ratio's plan is in the contract by name (int4_weight_formats); one made before that
        record existed is not guessed (test_export_tensor_formats.py)."""
        out = tmp_path / "mixed"
        assert main(["export", "--preset", "tiny", "-o", str(out), "-q", "--weight-format", "int4",
                     "--ratio", "0.5"]) == 0
        assert export_bytes_per_token(out)["bytes"] == pytest.approx(ir_hand_count(out), abs=1)
        assert export_bytes_per_token(out)["bytes"] > export_bytes_per_token(tiny_exports["int4"])["bytes"]

    def test_no_contract_says_so(self, tmp_path):
        with pytest.raises(Unknown, match="cannot read its contract"):
            export_bytes_per_token(tmp_path)


def _gguf(path: Path, tensors: list[tuple[str, tuple[int, ...], int]], meta: dict) -> Path:
    """A GGUF v3 header (the tensor data is not read by the count, so none is written)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, v in meta.items():
        out += s(k) + (struct.pack("<I", 8) + s(v) if isinstance(v, str) else struct.pack("<II", 4, v))
    for name, dims, ttype in tensors:
        out += s(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", ttype, 0)
    path.write_bytes(out)
    return path


class TestGgufBytesPerToken:
    META = {"general.architecture": "deepseek2", "deepseek2.expert_count": 4, "deepseek2.expert_used_count": 2}

    def test_hand_count(self, tmp_path):
        q8, f32, q4k, q6k, f16 = 8, 0, 12, 14, 1
        g = _gguf(tmp_path / "m.gguf", [
            ("token_embd.weight", (64, 100), q8),  # 100 rows of 64: 2 Q8_0 blocks (34 B) a row
            ("blk.0.attn_norm.weight", (64,), f32),
            ("blk.0.attn_kv_b.weight", (32, 256), f16),  # left out: the split k_b / v_b are there
            ("blk.0.attn_k_b.weight", (32, 128), f16),
            ("blk.0.attn_v_b.weight", (128, 32), f16),
            ("blk.0.ffn_gate_exps.weight", (256, 32, 4), q4k),  # 4 experts x 32 rows x 1 Q4_K block (144 B)
            ("blk.0.ffn_gate_shexp.weight", (256, 32), q4k),
            ("output.weight", (256, 100), q6k),
        ], self.META)
        want = 2 * 34 + 64 * 4 + 2 * 32 * 128 * 2 + 2 * 32 * 144 + 32 * 144 + 100 * 210
        assert gguf_bytes_per_token(g)["bytes"] == want

    def test_tied_output_reads_the_table_whole(self, tmp_path):
        g = _gguf(tmp_path / "t.gguf", [("token_embd.weight", (64, 100), 8)], self.META)
        assert gguf_bytes_per_token(g)["bytes"] == 2 * 34 + 100 * 2 * 34

    def test_an_unknown_type_is_not_guessed(self, tmp_path):
        g = _gguf(tmp_path / "u.gguf", [("blk.0.attn_q.weight", (256, 64), 250)], self.META)
        with pytest.raises(Unknown, match="blk.0.attn_q.weight has ggml type 250"):
            gguf_bytes_per_token(g)

    def test_ik_iq4_k(self, tmp_path):
        """ik_llama.cpp's IQ4_K (type 139): 144 bytes a block of 256."""
        g = _gguf(tmp_path / "k.gguf", [("blk.0.attn_q.weight", (256, 64), 139)], self.META)
        assert gguf_bytes_per_token(g)["bytes"] == 64 * 144

    def test_not_a_gguf(self, tmp_path):
        (tmp_path / "x.gguf").write_bytes(b"nope")
        with pytest.raises(Unknown, match="not a GGUF file"):
            gguf_bytes_per_token(tmp_path / "x.gguf")


def _bench(tmp_path, export, *args) -> tuple[int, dict, str]:
    rc = main(["bench", "--export-dir", str(export), "--systems", "ours", "--quick", "--quick-prompt-len", "16",
               "--new-tokens", "4", "--threads", "1", "--out-dir", str(tmp_path / "res"), "--work-dir",
               str(tmp_path / "work"), "--mem-wait", "0", *args])
    return rc, json.loads((tmp_path / "res/e2e.json").read_text()), (tmp_path / "res/e2e.md").read_text()


class TestBenchCarriesEfficiency:
    """e2e.json / e2e.md / the console carry the reads around each run and the efficiency."""

    def test_batch_1(self, tiny_exports, tmp_path, capsys):
        export = tiny_exports["int8"]
        rc, doc, md = _bench(tmp_path, export, "--batches", "1", "--bandwidth-mib", "64", "--bandwidth-passes", "1")
        assert rc == 0
        (r,) = doc["results"]
        assert r["ok"], r.get("error")
        before, after = r["read_gbps"]
        assert before > 0 and after > 0
        bpt = export_bytes_per_token(export)["bytes"]
        assert r["weight_bytes_per_token"] == bpt == doc["weight_bytes_per_token"]["ours"]["bytes"]
        assert r["efficiency"] == pytest.approx(bpt * r["decode_tok_s"] / ((before + after) / 2 * 1e9), rel=1e-3)
        assert doc["bandwidth"]["threads"] == 1 and doc["bandwidth"]["buffer_mib"] == 64
        (row,) = doc["aggregate"]
        assert row["efficiency"]["median"] == r["efficiency"] and row["read_gbps_before"]["median"] == before
        assert doc["summary"]["p16_b1_ours_efficiency"] == round(r["efficiency"], 3)
        assert "read GB/s before / after | weight MB/token | efficiency |" in md
        assert f"| {before:.1f} / {after:.1f} | {bpt / 1e6:.3f} | {r['efficiency']:.2f} |" in md
        out = capsys.readouterr().out
        assert f"efficiency (bytes/token x tok/s / plain read GB/s, batch 1): ours p16 {r['efficiency']:.2f}" in out

    def test_batch_2_says_why_there_is_none(self, tiny_exports, tmp_path):
        rc, doc, md = _bench(tmp_path, tiny_exports["int8"], "--batches", "2", "--bandwidth-mib", "64",
                             "--bandwidth-passes", "1")
        assert rc == 0
        (r,) = doc["results"]
        assert r["read_gbps"][0] > 0 and "efficiency" not in r
        assert r["efficiency_unknown"].startswith("batch 1 only")
        assert "not computed: batch 1 only" in md

    def test_no_bandwidth_skips_the_reads(self, tiny_exports, tmp_path, capsys):
        rc, doc, md = _bench(tmp_path, tiny_exports["int8"], "--batches", "1", "--no-bandwidth")
        assert rc == 0
        (r,) = doc["results"]
        assert "read_gbps" not in r and "efficiency" not in r and doc["bandwidth"] is None
        assert "efficiency: not measured (--no-bandwidth)" in capsys.readouterr().out

    def test_bad_bandwidth_options_are_refused(self, tiny_exports, tmp_path, capsys):
        rc = main(["bench", "--export-dir", str(tiny_exports["int8"]), "--systems", "ours", "--bandwidth-mib", "0",
                   "--out-dir", str(tmp_path / "res"), "--work-dir", str(tmp_path / "work")])
        assert rc == 2 and "--bandwidth-mib" in capsys.readouterr().err
        assert not (tmp_path / "res").exists()
