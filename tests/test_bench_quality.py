"""`mla-export bench quality` (mla_export/bench/quality*.py): the KL divergence of quantised
exports from their 16-bit base, as llama-perplexity --kl-divergence reports it. The math against
a float64 formula written out here; the parser on llama-perplexity's own output (ik_llama.cpp,
recorded on the Zen 4); the command end to end on the tiny checkpoint (f32 base hint, bf16 for the
quantised exports; OpenVINO), with the peers absent so that they report why."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mla_export.bench.quality import KLDStats, chunks_of, kld_rows, parse_llama_perplexity


class TestKldRows:
    def test_equal_logits_give_zero_and_same_top(self, rng):
        x = rng.normal(size=(5, 50)).astype(np.float32)
        kld, same = kld_rows(x, x)
        assert np.abs(kld).max() < 1e-12 and same.all()

    def test_against_the_definition(self, rng):
        a, b = rng.normal(size=(4, 30)) * 3, rng.normal(size=(4, 30)) * 3
        kld, same = kld_rows(a.astype(np.float32), b.astype(np.float32))
        for i in range(4):
            p = np.exp(a[i].astype(np.float32).astype(np.float64))
            q = np.exp(b[i].astype(np.float32).astype(np.float64))
            p, q = p / p.sum(), q / q.sum()
            assert kld[i] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-9, abs=1e-12)
            assert same[i] == (a[i].argmax() == b[i].argmax())

    def test_two_tokens_by_hand(self):
        # p = (1/2, 1/2), q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1)
        kld, _ = kld_rows(np.zeros((1, 2), np.float32), np.log(np.array([[0.9, 0.1]], np.float32)))
        assert kld[0] == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5.0), rel=1e-6)

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_non_finite_logits_are_refused(self, bad):
        x = np.zeros((2, 3), np.float32)
        y = x.copy()
        y[1, 2] = bad
        with pytest.raises(ValueError, match="other logits hold NaN or infinity"):
            kld_rows(x, y)

    def test_shapes_must_match(self):
        with pytest.raises(ValueError, match="one shape"):
            kld_rows(np.zeros((2, 3)), np.zeros((2, 4)))


class TestChunks:
    def test_whole_chunks_bos_first_tail_dropped(self):
        chunks = chunks_of(list(range(10, 31)), ctx=8, max_chunks=None, bos=1)
        assert chunks == [[1, *range(11, 18)], [1, *range(19, 26)]]

    def test_max_chunks_and_too_short(self):
        assert len(chunks_of(list(range(100)), 8, 3, None)) == 3
        with pytest.raises(ValueError, match="fewer than one chunk"):
            chunks_of(list(range(7)), 8, None, None)

    def test_stats_summary(self):
        s = KLDStats()
        s.add(np.array([0.0, 0.2, 0.4]), np.array([True, False, True]))
        r = s.summary()
        assert r["positions"] == 3 and r["mean_kld"] == pytest.approx(0.2) and r["median_kld"] == pytest.approx(0.2)
        assert r["max_kld"] == pytest.approx(0.4) and r["same_top_pct"] == pytest.approx(200 / 3)
        with pytest.raises(ValueError, match="no positions"):
            KLDStats().summary()


# ik_llama.cpp's llama-perplexity --kl-divergence, its Q8_0 of the 3-layer V2-Lite-dims checkpoint
# against its BF16 GGUF (3 chunks of 512; the Zen 4, 2026-12-06), cut to the lines around the figures.
IK_OUTPUT = """\
llama_init_from_model: n_ctx         = 512
kl_divergence: 1.56 seconds per pass - ETA 0.07 minutes

chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1    257159.0144 ± 21180.2598       0.00670 ±    0.00452       0.00255 ±    0.00003     0.000 ±  0.000 %    87.059 ±  2.106 %
   2    253061.8352 ± 14898.9162       0.00122 ±    0.00317       0.00262 ±    0.00002     0.000 ±  0.000 %    88.627 ±  1.407 %
   3    267039.5798 ± 13132.9214       0.00242 ±    0.00262       0.00262 ±    0.00002     0.000 ±  0.000 %    88.758 ±  1.143 %

====== KL divergence statistics ======
Mean    KLD:   0.002618 ±   0.000018
Maximum KLD:   0.004902
99.9%   KLD:   0.004888
99.0%   KLD:   0.003907
95.0%   KLD:   0.003428
90.0%   KLD:   0.003282
Median  KLD:   0.002569
10.0%   KLD:   0.002015
Minimum KLD:   0.001387

====== Token probability statistics ======
Mean    Δp:  0.000 ± 0.000 %
RMS Δp    :  0.000 ± 0.000 %
Same top p: 88.758 ± 1.143 %
"""


class TestParseLlamaPerplexity:
    def test_figures(self):
        r = parse_llama_perplexity(IK_OUTPUT)
        assert r == {"mean_kld": 0.002618, "mean_kld_err": 0.000018, "median_kld": 0.002569, "p99_kld": 0.003907,
                     "max_kld": 0.004902, "same_top_pct": 88.758, "same_top_err_pct": 1.143, "positions": 3 * 255}

    def test_a_failed_run_names_the_missing_line(self):
        with pytest.raises(ValueError, match="no mean kld line"):
            parse_llama_perplexity("main: error: unable to load model\n")


def test_bench_quality_on_the_tiny_checkpoint(tmp_path):
    """int8 moves the distributions far less than int4; the peers, absent, say how to set them up."""
    from mla_export.cli import main
    from mla_export.checkpoint.presets import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=5)
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog; " * 60 + "pack my box with five dozen liquor jugs. " * 60)
    out = tmp_path / "out"
    code = main(["bench", "quality", "--checkpoint", str(ckpt), "--text", str(text), "--systems",
                 "ours-int8,ours-int4,ik-Q8_0", "--ik-dir", str(tmp_path / "no-peer"), "--ctx", "32", "--chunks", "4",
                 "--work-dir", str(tmp_path / "work"), "--out-dir", str(out)])
    assert code == 0
    res = json.loads((out / "quality.json").read_text())
    r8, r4 = res["results"]["ours-int8"], res["results"]["ours-int4"]
    assert r8["positions"] == r4["positions"] == 4 * 15
    assert 0 < r8["mean_kld"] < r4["mean_kld"]
    assert "set it up with `mla-export bench setup-peers ik_llamacpp`" in res["unavailable"]["ik-Q8_0"]
    assert "| ours-int4 | ours-bf16 (f32 hint) | 60 |" in (out / "quality.md").read_text()


def test_bench_quality_refuses_what_it_cannot_measure(tmp_path, capsys):
    from mla_export.cli import main

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "t.txt").write_text("x")
    assert main(["bench", "quality", "--checkpoint", str(tmp_path), "--text", str(tmp_path / "t.txt"),
                 "--systems", "vllm-bf16"]) == 2
    assert "--systems: vllm-bf16: bench quality takes ours-<FORMAT>" in capsys.readouterr().err
    assert main(["bench", "quality", "--checkpoint", str(tmp_path), "--text", str(tmp_path / "missing.txt")]) == 2
    assert "--text" in capsys.readouterr().err
