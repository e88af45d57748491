"""`--tensor-format PATTERN=FORMAT` (issue 34): per-weight int8/int4 in an int4 export, as
llama-quantize's --tensor-type. What the IR stores is read back from its constants (int8 codes
exactly where a rule put them, int4 elsewhere), the graph is exact against transformers holding the
values those codes decode to, the contract records which weights each rule took, bytes_per_token
counts them as the IR stores them, and each bad request fails with one message naming it before
anything is written."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, hf_last_logits, load_hf, rel_err
from mla_export.bench.bytes_per_token import Unknown, export_bytes_per_token
from mla_export.checkpoint.presets import make_checkpoint
from mla_export.cli import main
from mla_export.export import export_model
from mla_export.export.quantize import dequantize, pick_group, quantize
from mla_export.formats.contract import load_contract

sys.path.insert(0, str(Path(__file__).parent))
from test_bench_efficiency import ir_hand_count  # noqa: E402

BLOCK, NUM_BLOCKS, TOL, GROUP = 4, 24, 1e-4, 32
# shared_experts first: the first matching rule decides, so the shared experts' down stays int4
RULES = ["shared_experts=int4", "down_proj=int8", "kv_a_proj_with_mqa=int8", "lm_head=int4"]


def _expected_bits(name: str) -> int:
    """RULES applied by hand to a checkpoint / transformers weight name (the embedding stays int8:
    no rule names it)."""
    if "shared_experts" in name or "lm_head" in name:
        return 4
    if "down_proj" in name or "kv_a_proj_with_mqa" in name or "embed_tokens" in name:
        return 8
    return 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """V2-Lite layout (q_proj, a dense first layer, shared experts), one tensor per expert on disk."""
    ckpt = make_checkpoint(tmp_path_factory.mktemp("tf") / "ckpt", "deepseek_v2", seed=21, q_lora_rank=None,
                           topk_method="greedy", n_shared_experts=2)
    return ckpt, json.loads((ckpt / "config.json").read_text())


@pytest.fixture(scope="module")
def mixed(checkpoint, tmp_path_factory):
    """The RULES export in both MoE forms (f32 cache, f32 float weights)."""
    ckpt, _ = checkpoint
    out = {}
    for form in ("fused", "grouped"):
        out[form] = tmp_path_factory.mktemp("mixed") / form
        export_model(ckpt, out[form], fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_format="int4",
                     group_size=GROUP, moe_form=form, tensor_formats=RULES)
    return out


def ir_code_formats(export_dir: Path, cfg: dict) -> dict[str, int]:
    """{stored weight name: code bits} from the IR's code constants: plain `W.q` (u8 / u4 element
    type), MlaQLinear's `W.qlinear.q` and the fused op's `P.experts.w13.q` / `.w2.q` (u8 bytes of a
    row: the inputs for int8, half of them for int4)."""
    from safetensors import safe_open

    shapes = {}
    ckpt = Path(json.loads((export_dir / "mla_graph.json").read_text())["export"]["source"])
    for f in ckpt.glob("*.safetensors"):
        with safe_open(str(f), "np") as s:
            shapes.update({k: s.get_slice(k).get_shape() for k in s.keys()})
    got = {}
    for layer in ET.parse(export_dir / "openvino_model.xml").getroot().iter("layer"):
        name = layer.get("name")
        if layer.get("type") != "Const" or not name.endswith(".q"):
            continue
        data = layer.find("data")
        dims = [int(d) for d in data.get("shape").split(",")]
        if name.endswith(".qlinear.q") or ".experts.w" in name:
            weight = name[:-len(".qlinear.q")] if name.endswith(".qlinear.q") else name[:-2]
            n_in = cfg["hidden_size"] if weight.endswith("w13") else \
                cfg["moe_intermediate_size"] if weight.endswith("w2") else shapes[weight][1]
            assert data.get("element_type") == "u8", name
            per_row = int(data.get("size")) // int(np.prod(dims[:-1]))
            assert per_row in (n_in, n_in // 2), (name, per_row, n_in)
            got[weight] = 8 if per_row == n_in else 4
        else:
            got[name[:-2]] = {"u8": 8, "u4": 4}[data.get("element_type")]
    return got


def _checkpoint_names(stored: str, cfg: dict) -> list[str]:
    """The checkpoint tensors a stored weight is made of."""
    if stored.endswith(".experts.w13"):
        return [f"{stored[:-4]}.{e}.{p}.weight" for e in range(cfg["n_routed_experts"]) for p in ("gate_proj", "up_proj")]
    if stored.endswith(".experts.w2"):
        return [f"{stored[:-3]}.{e}.down_proj.weight" for e in range(cfg["n_routed_experts"])]
    if stored.endswith(".gate_up_proj.weight"):
        return [stored.replace("gate_up_proj", "gate_proj"), stored.replace("gate_up_proj", "up_proj")]
    return [stored]


class TestRulesDecideTheStoredCodes:
    """int8 codes exactly for the weights RULES put in int8, int4 for every other code-stored weight."""

    @pytest.mark.parametrize("form", ["fused", "grouped"])
    def test_ir_constants(self, mixed, checkpoint, form):
        _, cfg = checkpoint
        got = ir_code_formats(mixed[form], cfg)
        expected = {w: {_expected_bits(n) for n in _checkpoint_names(w, cfg)} for w in got}
        assert all(len(b) == 1 for b in expected.values()), expected  # each stored tensor: one format
        assert {w: b.pop() for w, b in expected.items()} == got
        assert 8 in got.values() and 4 in got.values()
        assert got["lm_head.weight"] == 4 and got["model.embed_tokens.weight"] == 8
        assert got["model.layers.1.mlp.shared_experts.down_proj.weight"] == 4  # the first rule decided
        n_exp = cfg["n_routed_experts"]
        routed = [w for w in got if ".experts." in w and "shared" not in w]
        assert len(routed) == (2 * (cfg["num_hidden_layers"] - 1) * (1 if form == "fused" else n_exp))

    def test_contract_records_each_rules_weights(self, mixed, checkpoint):
        _, cfg = checkpoint
        export = load_contract(mixed["fused"]).raw["export"]
        got = ir_code_formats(mixed["fused"], cfg)
        rules = {r["rule"]: r["weights"] for r in export["tensor_formats"]}
        assert list(rules) == RULES
        assert rules["down_proj=int8"] == sorted(w for w in got if "down_proj" in w and "shared" not in w
                                                 or w.endswith("experts.w2"))
        assert rules["lm_head=int4"] == ["lm_head.weight"]
        # the weights not in the int4 default rule's format, by name
        default = {w: 8 if w in ("lm_head.weight", "model.embed_tokens.weight") else 4 for w in got}
        assert export["int4_weight_formats"] == {w: f"int{b}" for w, b in sorted(got.items()) if b != default[w]}
        params = export["weight_params"]
        assert params["int8"] > 0 and params["int4"] > 0


class TestMixedLogits:
    """f32 logits of the mixed export against transformers holding what its codes decode to (exact,
    as the all-int4 exports in test_export_quantized.py), and against the unquantized model within
    that file's int4 bound."""

    @pytest.mark.parametrize("form", ["fused", "grouped"])
    def test_against_transformers(self, mixed, checkpoint, form, rng):
        import torch

        from test_export_models import openvino_runner

        ckpt, _ = checkpoint
        hf_f32, hf = load_hf(ckpt), load_hf(ckpt)
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith("kv_b_proj.weight") or not name.endswith(
                        ("proj.weight", "proj", "proj_with_mqa.weight", "embed_tokens.weight", "lm_head.weight")):
                    continue
                bits = _expected_bits(name)
                w = p.detach().float().numpy()
                p.copy_(torch.from_numpy(dequantize(quantize(w, bits, pick_group(w.shape[-1], GROUP) if bits == 4
                                                              else None))))
        c = hf.config
        run, _ = openvino_runner(mixed[form] / "openvino_model.xml", c.num_hidden_layers,
                                 c.kv_lora_rank + c.qk_rope_head_dim)
        prompts = {s: np.random.default_rng(5).integers(2, c.vocab_size, n) for s, n in (("a", 9), ("b", 11), ("c", 1))}
        schedule = [[("a", 9), ("b", 6), ("c", 1)], [("b", 5), ("a", None), ("c", None)],
                    [("c", None), ("a", None), ("b", None)]]
        stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, schedule, TOL)
        assert stats["agree"] == stats["total"]
        worst = max(rel_err(hf_last_logits(hf, t), hf_last_logits(hf_f32, t))
                    for t in ([int(x) for x in p] for p in prompts.values()))
        assert worst < 0.5


class TestBytesPerTokenCountsEachWeightsFormat:
    """export_bytes_per_token from config.json and the contract equals the hand count over the IR's
    constants, for the mixed exports and for --ratio's plan (recorded by name the same way)."""

    @pytest.mark.parametrize("form", ["fused", "grouped"])
    def test_mixed(self, mixed, form):
        got = export_bytes_per_token(mixed[form])["bytes"]
        assert got == pytest.approx(ir_hand_count(mixed[form]), abs=1)

    def test_more_than_all_int4_less_than_all_int8(self, mixed, checkpoint, tmp_path):
        ckpt, _ = checkpoint
        b = {}
        for tag, extra in (("int4", {}), ("int8", {})):
            export_model(ckpt, tmp_path / tag, weight_format=tag, group_size=GROUP, moe_form="fused", **extra)
            b[tag] = export_bytes_per_token(tmp_path / tag)["bytes"]
        assert b["int4"] < export_bytes_per_token(mixed["fused"])["bytes"] < b["int8"]

    def test_ratio_plan(self, checkpoint, tmp_path):
        ckpt, _ = checkpoint
        out = tmp_path / "r"
        export_model(ckpt, out, weight_format="int4", group_size=GROUP, ratio=0.5)
        assert load_contract(out).raw["export"]["int4_weight_formats"]
        assert export_bytes_per_token(out)["bytes"] == pytest.approx(ir_hand_count(out), abs=1)

    def test_a_ratio_contract_without_the_record_is_not_guessed(self, checkpoint, tmp_path):
        ckpt, _ = checkpoint
        out = tmp_path / "r"
        export_model(ckpt, out, weight_format="int4", group_size=GROUP, ratio=0.5)
        contract = json.loads((out / "mla_graph.json").read_text())
        del contract["export"]["int4_weight_formats"]  # an export made before the record existed
        (out / "mla_graph.json").write_text(json.dumps(contract))
        with pytest.raises(Unknown, match="--ratio 0.5"):
            export_bytes_per_token(out)


def _cli_error(capsys, tmp_path, ckpt, *args) -> str:
    out = tmp_path / "out"
    code = main(["export", str(ckpt), "-o", str(out), "-q", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))  # nothing written
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


class TestBadRulesFailNamingThemselves:
    """Each bad --tensor-format: exit 2, one line naming it, no output."""

    @pytest.mark.parametrize("spec,message", [
        ("down_proj", "give PATTERN=FORMAT"),
        ("=int8", "the PATTERN before '=' is empty"),
        ("down_proj=int2", "FORMAT must be int8 or int4, got 'int2'"),
        ("down_proj=fp8", "FORMAT must be int8 or int4, got 'fp8'"),
        ("down_proj(=int8", "'down_proj\\(' is not a regular expression"),
    ])
    def test_malformed(self, capsys, tmp_path, checkpoint, spec, message):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", "int4", "--tensor-format", spec)
        assert re.escape(spec) in re.escape(err) and re.search(message, err), err

    @pytest.mark.parametrize("fmt", ["int8", "bf16", "fp8", "auto"])
    def test_not_an_int4_export(self, capsys, tmp_path, checkpoint, fmt):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", fmt, "--tensor-format", "down_proj=int8")
        assert f"--tensor-format applies to --weight-format int4 only (got --weight-format {fmt})" in err

    def test_with_ratio(self, capsys, tmp_path, checkpoint):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", "int4", "--ratio", "0.5",
                         "--tensor-format", "down_proj=int8")
        assert "--tensor-format and --ratio cannot be combined" in err

    def test_matches_no_checkpoint_tensor(self, capsys, tmp_path, checkpoint):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", "int4", "--tensor-format", "down_porj=int8")
        assert "--tensor-format 'down_porj=int8': the pattern matches no tensor of the checkpoint" in err

    @pytest.mark.parametrize("spec", ["kv_b_proj=int8", "layernorm=int8", r"mlp\.gate\.=int8"])
    def test_matches_only_float_weights(self, capsys, tmp_path, checkpoint, spec):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", "int4", "--tensor-format", spec)
        assert f"--tensor-format {spec!r}: the pattern matches only weights kept float" in err

    @pytest.mark.parametrize("spec,stored", [
        ("experts.0.down_proj=int8", "model.layers.1.mlp.experts.w2"),  # fused: one format for all experts
        ("experts.*gate_proj=int8", "model.layers.1.mlp.experts.w13"),  # gate and up are one tensor
    ])
    def test_splits_a_stored_tensor(self, capsys, tmp_path, checkpoint, spec, stored):
        err = _cli_error(capsys, tmp_path, checkpoint[0], "--weight-format", "int4", "--group-size", "32",
                         "--tensor-format", spec)
        assert f"--tensor-format {spec!r} matches" in err and f"stored together as one tensor ({stored}" in err

    def test_grouped_form_takes_one_expert(self, checkpoint, tmp_path):
        """Per-expert weights (the grouped form) may differ expert by expert; the count follows."""
        ckpt, cfg = checkpoint
        out = tmp_path / "g"
        export_model(ckpt, out, weight_format="int4", group_size=GROUP, moe_form="grouped",
                     tensor_formats=[r"experts\.0\.down_proj=int8"])
        got = ir_code_formats(out, cfg)
        assert {w for w, b in got.items() if b == 8} == {"model.embed_tokens.weight", "lm_head.weight",
                                                         "model.layers.1.mlp.experts.0.down_proj.weight",
                                                         "model.layers.2.mlp.experts.0.down_proj.weight"}
        assert export_bytes_per_token(out)["bytes"] == pytest.approx(ir_hand_count(out), abs=1)


class TestRecipe:
    """--recipe NAME: its group size and rules, exactly as if given by hand; the user's own rules and
    group size take precedence; a recipe rule that finds nothing in a checkpoint is no error."""

    def test_same_codes_as_its_rules_by_hand(self, checkpoint, tmp_path):
        from mla_export.export.recipes import RECIPES

        ckpt, cfg = checkpoint
        r = RECIPES["int4-mixed"]
        assert main(["export", str(ckpt), "-o", str(tmp_path / "recipe"), "-q", "--recipe", "int4-mixed"]) == 0
        by_hand = ["--weight-format", "int4", "--group-size", str(r.group_size)]
        for rule in r.tensor_formats:
            by_hand += ["--tensor-format", rule]
        assert main(["export", str(ckpt), "-o", str(tmp_path / "hand"), "-q", *by_hand]) == 0
        got = ir_code_formats(tmp_path / "recipe", cfg)
        assert got == ir_code_formats(tmp_path / "hand", cfg) and 8 in got.values()
        recipe, hand = (load_contract(tmp_path / d).raw["export"] for d in ("recipe", "hand"))
        assert recipe["recipe"] == "int4-mixed" and hand["recipe"] is None
        assert recipe["int4_weight_formats"] == hand["int4_weight_formats"]
        assert recipe["int4_group_sizes"] == hand["int4_group_sizes"]
        assert export_bytes_per_token(tmp_path / "recipe")["bytes"] == pytest.approx(
            ir_hand_count(tmp_path / "recipe"), abs=1)

    def test_the_users_rules_and_group_come_first(self, checkpoint, tmp_path):
        ckpt, cfg = checkpoint
        out = tmp_path / "o"
        export_model(ckpt, out, recipe="int4-mixed", group_size=32, tensor_formats=["o_proj=int4"])
        export = load_contract(out).raw["export"]
        assert export["int4_group_sizes"] == [32]  # the recipe's 128 falls back to 64 on this checkpoint's 64 inputs
        got = ir_code_formats(out, cfg)
        assert all(b == 4 for w, b in got.items() if "o_proj" in w)
        assert all(b == 8 for w, b in got.items() if "q_proj" in w or "kv_a_proj" in w)  # the recipe's rule

    def test_a_rule_finding_nothing_is_no_error(self, tmp_path):
        """A tied checkpoint has no lm_head.weight: the recipe's lm_head rule decides nothing (the
        embedding table, int8, serves as lm_head)."""
        ckpt = make_checkpoint(tmp_path / "ckpt", "deepseek_v2", seed=3, q_lora_rank=None, topk_method="greedy",
                               tie_word_embeddings=True)
        from safetensors import safe_open

        for f in ckpt.glob("*.safetensors"):
            with safe_open(str(f), "np") as st:
                assert "lm_head.weight" not in st.keys()
        export_model(ckpt, tmp_path / "o", recipe="int4-mixed")
        rules = {r["rule"]: r["weights"] for r in load_contract(tmp_path / "o").raw["export"]["tensor_formats"]}
        assert rules["lm_head=int4"] == [] and rules["self_attn=int8"]
        with pytest.raises(Exception, match="'lm_head=int4'"):  # the same rule given by hand must decide something
            export_model(ckpt, tmp_path / "h", weight_format="int4", tensor_formats=["lm_head=int4"])

    @pytest.mark.parametrize("extra,message", [
        (["--weight-format", "int8"], "--recipe int4-mixed is an int4 recipe: it cannot be combined with --weight-format int8"),
        (["--ratio", "0.5"], "--recipe int4-mixed fixes which weights are int8: it cannot be combined with --ratio"),
    ])
    def test_conflicts(self, capsys, tmp_path, checkpoint, extra, message):
        assert message in _cli_error(capsys, tmp_path, checkpoint[0], "--recipe", "int4-mixed", *extra)

    def test_unknown_name(self, checkpoint, tmp_path):
        from mla_export.export import ExportError

        with pytest.raises(ExportError, match="--recipe must be one of int4-mixed, got 'q4'"):
            export_model(checkpoint[0], tmp_path / "o", recipe="q4")
        assert not (tmp_path / "o").exists()
