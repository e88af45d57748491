"""Issue 36, causes 1 and 5: config.json is untrusted input to the exporter, mla_graph.json to the
loader (docs/SAFETY.md, "The exporter's config boundary" and "Loading an export").

Each cause has its cases one by one and a seeded fuzz (the seed is printed: MLA_TEST_SEED replays
it). The fuzz runs its cases in tests/hostile_worker.py, a process under an address-space limit
and a timeout, so a regression that allocates what a hostile value asks for or loops over it
fails here instead of taking the machine: every case must end within seconds in one clear error
naming the key (or, for a config, in a valid export; for a contract, in a load).
"""

from __future__ import annotations

import base64
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mla_export.checkpoint.config import ConfigError, MLAModelConfig
from mla_export.formats.contract_error import ContractError
from mla_export.formats.contract import load_contract
from mla_export.checkpoint.presets import make_numpy_checkpoint, tiny_config

WORKER = Path(__file__).with_name("hostile_worker.py")
MEMORY_LIMIT = 3 << 30  # address space of the worker (numpy + onnx import: ~1.3 GiB)
CASE_SECONDS = 20  # the worker's own per-case limit (hostile_worker.CASE_SECONDS)
FAST_SECONDS = 5.0  # what an error case may take (a valid tiny export: ~0.3-1 s)
USER_ERRORS = {"ConfigError", "ExportError", "WeightError"}  # the exporter's one-message errors (exit 2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The tiny preset's checkpoint (numpy weights, no torch)."""
    return make_numpy_checkpoint(tmp_path_factory.mktemp("hostile") / "ckpt", "deepseek_v3", seed=0)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_worker(mode: str, cases: list, source: Path, tmp_path: Path) -> list[dict]:
    """Every case's result line; a worker killed (memory) or stopped (time) fails naming the case."""
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases))
    # one BLAS/OpenMP thread: their per-thread buffers would count against the limit on a many-core CI machine
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent)] + sys.path),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    budget = 30 + len(cases) * 3
    try:
        proc = subprocess.run([sys.executable, str(WORKER), mode, str(cases_file), str(source), str(tmp_path / "work")],
                              capture_output=True, text=True, timeout=budget, preexec_fn=_limit_memory, env=env)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, code = (e.stdout or b"").decode(), (e.stderr or b"").decode(), f"timeout after {budget} s"
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if len(results) != len(cases):
        started = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("start ")]
        last = started[-1] if started else None
        pytest.fail(f"the worker ended ({code}) in case {last}: {json.dumps(cases[last])[:400] if last is not None else ''}"
                    f"\nstderr: {stderr[-2000:]}")
    return results


# ------------------------------------------------------------------------------- cause 1
HOSTILE = [10 ** 9, 2 ** 31, 10 ** 12, -1, 0, 1.5, float("nan"), float("inf"), -float("inf"), True, False, "7", "",
           [], [1, 2], {}, None, 1e308, 10 ** 300, 2, 7, 3]
# Keys the tiny config lacks that a family reads (their defaults are used when absent).
EXTRA_KEYS = ["partial_rotary_factor", "rope_theta", "original_max_position_embeddings", "mlp_layer_types",
              "moe_layer_freq", "zero_expert_num", "head_dim", "rope_scaling", "quantization_config", "hidden_act",
              "scoring_func", "topk_method", "dtype"]
ALIASES = {"rope_scaling": ["rope"], "quantization_config": ["quantiz"], "mlp_layer_types": ["mlp_layer_types",
           "first_k_dense_replace"], "scoring_func": ["scoring_func"], "topk_method": ["topk_method"]}
# Pairs of values that are each fine and contradict each other.
CONTRADICTIONS = [
    dict(num_experts_per_tok=9), dict(n_group=3), dict(topk_group=3), dict(n_routed_experts=6, n_group=4),
    dict(first_k_dense_replace=3), dict(first_k_dense_replace=0), dict(mlp_layer_types=["dense", "dense"]),
    dict(num_hidden_layers=4), dict(num_hidden_layers=2), dict(vocab_size=1), dict(eos_token_id=384),
    dict(bos_token_id=[0, 1]), dict(qk_rope_head_dim=15), dict(q_lora_rank=None), dict(kv_lora_rank=16),
    dict(hidden_size=32), dict(num_attention_heads=8), dict(v_head_dim=16), dict(intermediate_size=64),
    dict(moe_intermediate_size=16), dict(rope_scaling=dict(rope_type="yarn", factor=0)),
    dict(partial_rotary_factor=0.5), dict(rope_parameters=dict(rope_type="longrope")),
    dict(rope_parameters=dict(rope_type="dynamic")), dict(max_position_embeddings=2 ** 22),
]


def _expected_names(change: dict, removed: list[str]) -> list[str]:
    """Words one of which the error must contain: the keys the case touched."""
    names = []
    for key, value in change.items():
        names += ALIASES.get(key, [key])
        if isinstance(value, dict):
            names += list(value)
    return names + removed


def config_cases(rng, n: int) -> list[dict]:
    base = tiny_config("deepseek_v3")
    base["model_type"] = "deepseek_v3"
    keys = sorted(base) + EXTRA_KEYS
    rope_keys = sorted(base["rope_parameters"])
    cases = []
    for i in range(n):
        cfg = json.loads(json.dumps(base))
        kind = ("value", "rope value", "missing", "contradiction")[i % 4]
        change, removed = {}, []
        if kind == "value":
            for key in rng.choice(keys, size=int(rng.integers(1, 3)), replace=False):
                change[str(key)] = HOSTILE[int(rng.integers(len(HOSTILE)))]
        elif kind == "rope value":
            key = str(rng.choice(rope_keys))
            change["rope_parameters"] = dict(cfg["rope_parameters"], **{key: HOSTILE[int(rng.integers(len(HOSTILE)))]})
        elif kind == "missing":
            removed = [str(k) for k in rng.choice(keys[:len(base)], size=int(rng.integers(1, 3)), replace=False)]
        else:
            change = CONTRADICTIONS[int(rng.integers(len(CONTRADICTIONS)))]
        cfg.update(change)
        for key in removed:
            cfg.pop(key, None)
        cases.append(dict(config=cfg, kind=kind, names=_expected_names(change, removed)))
    return cases


class TestConfigBoundary:
    """Cause 1, case by case: a hostile value ends in one ConfigError naming its key, in
    milliseconds, before anything is sized by it (each of these hung, allocated gigabytes or
    ended in a traceback before the fix)."""

    @pytest.mark.parametrize("change, key", [
        (dict(num_hidden_layers=10 ** 9), "num_hidden_layers"),  # was: a billion-entry per-layer list
        (dict(max_position_embeddings=2 ** 31), "max_position_embeddings"),  # was: 8 GiB RoPE tables
        (dict(max_position_embeddings=10 ** 12), "max_position_embeddings"),  # was: 3.6 TiB
        (dict(rope_parameters=dict(rope_type="yarn", rope_theta=float("nan"), factor=4.0)), "rope_theta"),
        (dict(rms_norm_eps=float("inf")), "rms_norm_eps"),  # was: an export of NaN outputs
        (dict(routed_scaling_factor="x"), "routed_scaling_factor"),  # was: ValueError traceback
        (dict(partial_rotary_factor="x"), "partial_rotary_factor"),  # was: 'x' * 16 -> int() traceback
        (dict(model_type=["deepseek_v3"]), "model_type"),  # was: unhashable type traceback
        (dict(attention_bias="false"), "attention_bias"),  # was: a truthy string read as true
        (dict(hidden_size=2 ** 40), "hidden_size"),
        (dict(n_routed_experts=10 ** 12), "n_routed_experts"),
        (dict(rope_parameters=dict(rope_type="yarn", factor=[4.0])), "rope_parameters.factor"),
        (dict(rope_parameters="yarn"), "rope_parameters"),
        (dict(dtype=["bfloat16"]), "dtype"),
    ])
    def test_value_refused_naming_the_key(self, change, key):
        raw = {**tiny_config("deepseek_v3"), "model_type": "deepseek_v3", **change}
        t = time.perf_counter()
        with pytest.raises(ConfigError, match=rf"config\.json: .*{key}"):
            MLAModelConfig.from_dict(raw)
        assert time.perf_counter() - t < 1.0

    def test_rope_tables_sized_by_what_the_export_holds(self, checkpoint, tmp_path):
        """The RoPE tables have one row per position the export holds: --max-model-len sizes them
        (and the contract, and MlaStepCheck) below config.json's maximum; more than the config's
        maximum is refused."""
        import onnx

        from mla_export.export import ExportError, export_model

        export_model(checkpoint, tmp_path / "out", fmt="onnx", max_model_len=64)
        assert load_contract(tmp_path / "out").model["max_position_embeddings"] == 64
        graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph
        assert [list(t.dims) for t in graph.initializer if t.name == "rope.cos"] == [[64, 16]]
        check = next(n for n in graph.node if n.op_type == "MlaStepCheck")
        assert {a.name: a.i for a in check.attribute}["max_positions"] == 64
        with pytest.raises(ExportError, match=r"--max-model-len must be an integer from 1 to the model's "
                                              r"max_position_embeddings \(512\), got 513"):
            export_model(checkpoint, tmp_path / "out2", fmt="onnx", max_model_len=513)

    def test_max_model_len_flag(self, checkpoint, tmp_path, capsys):
        from mla_export.cli import main

        assert main(["export", str(checkpoint), "-o", str(tmp_path / "out"), "--format", "onnx", "-q",
                     "--max-model-len", "100"]) == 0
        assert load_contract(tmp_path / "out").model["max_position_embeddings"] == 100
        assert main(["export", str(checkpoint), "-o", str(tmp_path / "out2"), "--max-model-len", "0", "-q"]) == 2
        assert "--max-model-len must be an integer from 1" in capsys.readouterr().err

    def test_rope_tables_bounded_by_their_bytes(self, checkpoint, tmp_path):
        """A context whose tables would exceed the limit at this rope width is refused by their
        size before any is computed (2**22 positions x 4096 rotated dims: 128 GiB), naming the
        flag that exports a shorter one; with it the export goes on (here to the weights' check)."""
        from mla_export.export import ExportError, export_model

        model = tmp_path / "model"
        shutil.copytree(checkpoint, model)
        raw = json.loads((model / "config.json").read_text())
        raw.update(max_position_embeddings=2 ** 22, qk_rope_head_dim=4096)
        (model / "config.json").write_text(json.dumps(raw))
        with pytest.raises(ExportError, match=r"4194304 positions at qk_rope_head_dim 4096 need RoPE tables of "
                                              r"128\.0 GiB .* pass a shorter --max-model-len"):
            export_model(model, tmp_path / "out", fmt="onnx")
        with pytest.raises(ConfigError, match="kv_lora_rank, qk_rope_head_dim, hidden_size disagree with the weights"):
            export_model(model, tmp_path / "out", fmt="onnx", max_model_len=4096)

    @pytest.mark.parametrize("text, what", [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than the parser allows"),  # was: RecursionError
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", "not readable as JSON"),  # was: ValueError (int digits)
        ('{"model_type": "deepseek_v3"}\xff', "not readable as JSON"),
    ])
    def test_unparseable_config_is_one_error(self, tmp_path, text, what):
        (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(ConfigError, match=what) as e:
            MLAModelConfig.from_dir(tmp_path)
        assert str(e.value).startswith(f"{tmp_path / 'config.json'}: ")

    def test_oversized_config_is_refused_unread(self, tmp_path):
        with open(tmp_path / "config.json", "wb") as f:
            f.truncate(65 << 20)  # sparse: no 65 MiB written
        with pytest.raises(ConfigError, match=r"config\.json: 68157440 bytes, more than the 64 MiB"):
            MLAModelConfig.from_dir(tmp_path)

    def test_one_bos_id_in_a_list_is_that_id(self):
        """`bos_token_id: [5]` was kept as a list, and the export died at its very end (the contract
        takes an integer)."""
        cfg = MLAModelConfig.from_dict(dict(tiny_config("deepseek_v3"), model_type="deepseek_v3", bos_token_id=[5]))
        assert cfg.bos_token_id == 5

    @pytest.mark.parametrize("change, message", [
        (dict(num_hidden_layers=300), r"num_hidden_layers 300 means 300 decoder layers, but the weights hold 3"),
        (dict(vocab_size=500), r"vocab_size, hidden_size disagree with the weights: model\.embed_tokens\.weight is "
                               r"\[384, 64\], the config implies \[500, 64\]"),
        (dict(kv_lora_rank=16), r"kv_lora_rank, qk_rope_head_dim, hidden_size disagree with the weights"),
        (dict(v_head_dim=16), r"v_head_dim.* disagree with the weights: model\.layers\.0\.self_attn\.kv_b_proj"),
        (dict(first_k_dense_replace=2), r"first_k_dense_replace / mlp_layer_types / moe_layer_freq make layer 1 a "
                                        r"dense layer, but the weights hold a MoE block there"),
        (dict(n_routed_experts=4, n_group=2), r"n_routed_experts, hidden_size disagree with the weights"),
    ])
    def test_weights_bound_the_config(self, checkpoint, tmp_path, change, message):
        """What the safetensors headers hold bounds the config before the exporter loops over its
        layers (300 claimed layers used to be planned, and the export fail at layer 3 naming a
        tensor, not the key)."""
        from mla_export.export import export_model

        model = tmp_path / "model"
        shutil.copytree(checkpoint, model)
        raw = json.loads((model / "config.json").read_text())
        raw.update(change)
        (model / "config.json").write_text(json.dumps(raw))
        t = time.perf_counter()
        with pytest.raises(ConfigError, match=message):
            export_model(model, tmp_path / "out", fmt="onnx")
        assert time.perf_counter() - t < FAST_SECONDS
        assert not (tmp_path / "out").exists()

    def test_config_limits_agree_with_the_contract_schema(self):
        """An export of a config at the limits must load: the contract schema's maxima are the
        config boundary's."""
        from mla_export.checkpoint import config_values as cv
        from mla_export.formats.contract import schema

        model = schema()["properties"]["model"]["properties"]
        for key, limit in [("num_layers", cv.MAX_LAYERS), ("vocab_size", cv.MAX_VOCAB),
                           ("max_position_embeddings", cv.MAX_POSITIONS), ("hidden_size", cv.KEYS["hidden_size"][2]),
                           ("num_heads", cv.KEYS["num_attention_heads"][2]),
                           ("kv_lora_rank", cv.KEYS["kv_lora_rank"][2]), ("q_lora_rank", cv.KEYS["q_lora_rank"][2]),
                           ("qk_rope_head_dim", cv.KEYS["qk_rope_head_dim"][2]),
                           ("qk_nope_head_dim", cv.KEYS["qk_nope_head_dim"][2]),
                           ("v_head_dim", cv.KEYS["v_head_dim"][2]), ("n_routed_experts", cv.MAX_EXPERTS)]:
            assert model[key]["maximum"] == limit, key


class TestConfigFuzz:
    """Cause 1's fuzz: hostile values (types, magnitudes 1e9 / 2**31 / 1e12, negative, NaN, inf,
    bool, str, list, object, null) of every key, missing keys and contradictory ones, through the
    whole exporter. Each case ends within seconds in one user error naming a key it touched, or
    in an export that loads. MLA_CONFIG_FUZZ_CASES=N for more (default 200: ~20 s here)."""

    def test_fuzz(self, rng, checkpoint, tmp_path):
        n = int(os.environ.get("MLA_CONFIG_FUZZ_CASES", "200"))
        cases = config_cases(rng, n)
        results = run_worker("config", cases, checkpoint, tmp_path)
        problems, exported = [], 0
        for case, r in zip(cases, results):
            what = f"case {r['i']} ({case['kind']}; {json.dumps({k: case['config'].get(k) for k in case['names']})[:200]})"
            if r["outcome"] == "ok":
                exported += 1
                continue
            if r["outcome"] == "timeout":
                problems.append(f"{what}: {r['message']}")
            elif r["type"] not in USER_ERRORS:
                problems.append(f"{what}: {r['type']}: {r['message'][:200]}\n{r.get('traceback', '')[-1200:]}")
            elif not any(name in r["message"] for name in case["names"]):
                problems.append(f"{what}: the error does not name {case['names']}: {r['message'][:300]}")
            elif r["seconds"] > FAST_SECONDS:
                problems.append(f"{what}: the error took {r['seconds']} s")
        print(f"{len(cases)} config cases: {exported} exported, {len(cases) - exported - len(problems)} refused "
              f"naming the key, {len(problems)} problems")
        assert not problems, "\n".join(problems[:10])


# ------------------------------------------------------------------------------- cause 5
@pytest.fixture(scope="module")
def export_dir(exports) -> Path:
    return exports.model("deepseek_v3", fmt="onnx")[1]


def _rewrite(export_dir: Path, tmp_path: Path, edit=None, text: str | None = None) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(export_dir, out)
    if text is None:
        raw = json.loads((out / "mla_graph.json").read_text())
        edit(raw)
        text = json.dumps(raw)
    (out / "mla_graph.json").write_text(text)
    return out


class TestLoadingAnExport:
    """Cause 5, case by case: each of these loaded, or ended in a traceback or an error not
    naming the file, before the fix."""

    @pytest.mark.parametrize("edit, key", [
        (lambda r: r["model"].update(eos_token_ids=[10 ** 6]), "model.eos_token_ids holds 1000000, outside the vocab"),
        (lambda r: r["model"].update(bos_token_id=-5), "model.bos_token_id holds -5, outside the vocabulary"),
        (lambda r: r["model"].update(eos_token_ids=[r["model"]["vocab_size"]]), "model.eos_token_ids"),
        (lambda r: r["model"].update(softmax_scale=float("nan")), "model.softmax_scale: expected number"),
        (lambda r: r["model"].update(num_layers=10 ** 9), "model.num_layers: must be <= 1024"),  # was: 1e9 specs
        (lambda r: r["cache"].update(block_size=10 ** 30), "cache.block_size: must be <= 65536"),
        (lambda r: r.update(version=True), "version: must be 1"),
        (lambda r: r["files"].update(onnx="."), "files.onnx '.' must be a plain name"),  # was: IndexError
        (lambda r: r["files"].update(onnx="a\0b"), "files.onnx"),  # was: ValueError (embedded null byte)
        (lambda r: r["files"].update(onnx="x" * 300), "files.onnx"),  # was: OSError (name too long)
        (lambda r: r["files"].update(onnx="elsewhere.onnx"), "files.onnx: file(s) listed are missing"),
        (lambda r: r["cache"].update(dtype="int8", row_layout=None), "cache.row_layout: expected string"),
        (lambda r: r["model"].update(sparse_attention=dict(index_n_heads=1, index_head_dim=2, index_topk=1,
                                                           indexer_types=["full"])), "model.sparse_attention"),
    ])
    def test_error_names_file_and_key(self, export_dir, tmp_path, edit, key):
        out = _rewrite(export_dir, tmp_path, edit)
        with pytest.raises(ContractError) as e:
            load_contract(out)
        assert str(e.value).startswith(f"{out / 'mla_graph.json'}: "), str(e.value)
        assert key in str(e.value)

    @pytest.mark.parametrize("text, what", [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than the parser allows"),  # was: RecursionError
        ('{"version": ' + "9" * 5000 + "}", "not readable as JSON"),  # was: ValueError (int digits)
        ('{"version": 1, "x": "\\ud800"}\xff', "not readable as JSON"),
        ("[]", "expected object"),
    ])
    def test_unparseable_file_is_one_error(self, export_dir, tmp_path, text, what):
        out = _rewrite(export_dir, tmp_path, text=text)
        with pytest.raises(ContractError, match=what) as e:
            load_contract(out)
        assert str(e.value).startswith(f"{out / 'mla_graph.json'}: ")

    def test_eos_outside_the_vocabulary_never_reaches_the_engine(self, export_dir, tmp_path):
        """The engine stops a sequence only at an eos id it can sample; one outside the vocabulary
        made every generation run to max_tokens. Loading the model directory refuses it."""
        from mla_export.runtime.model_dir import load_model_dir

        out = _rewrite(export_dir, tmp_path, lambda r: r["model"].update(eos_token_ids=[1, 999_999]))
        with pytest.raises(ContractError, match=r"model\.eos_token_ids holds 999999"):
            load_model_dir(out)


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON document."""
    yield prefix, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def _set(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    if value is _DELETE:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


_DELETE = object()
CONTRACT_VALUES = HOSTILE + [-(2 ** 63), 2 ** 64, "../../etc/passwd", "/etc/passwd", "model.onnx", "\0", "x" * 10_000,
                             [[[[[[[[[[[]]]]]]]]]]], {"a": {"b": {"c": {}}}}, _DELETE]


def contract_cases(rng, base: dict, n: int) -> list[dict]:
    paths = [p for p, _ in _paths(base) if p]
    text = json.dumps(base)
    cases = []
    for i in range(n):
        kind = ("value", "value", "value", "text")[i % 4]
        if kind == "value":
            doc = json.loads(text)
            path = paths[int(rng.integers(len(paths)))]
            value = CONTRACT_VALUES[int(rng.integers(len(CONTRACT_VALUES)))]
            _set(doc, path, value)
            data = json.dumps(doc).encode()
            names = [str(k) for k in path if isinstance(k, str)]
        else:  # the file's bytes: cut short, a byte changed, deep nesting or a huge number spliced in
            raw = text.encode()
            at = int(rng.integers(1, len(raw)))
            data = [raw[:at], raw[:at] + bytes([int(rng.integers(256))]) + raw[at + 1:],
                    raw[:at] + b"[" * 50_000 + raw[at:], raw[:at] + b"9" * 5000 + raw[at:]][i // 4 % 4]
            names, path = [], ()
        cases.append(dict(data=base64.b64encode(data).decode(), kind=kind, path=[str(k) for k in path], names=names))
    return cases


class TestContractFuzz:
    """Cause 5's fuzz: values anywhere in mla_graph.json replaced by hostile ones (types, huge and
    negative numbers, NaN, paths out of the directory, deep nesting) or deleted, and the file's
    bytes cut, changed, deeply nested or given a 5000-digit number. Each case loads, or ends
    within seconds in one ContractError whose message starts with the file's path and (for a
    changed value) names a key on its path. MLA_CONTRACT_FUZZ_CASES=N for more (default 200)."""

    def test_fuzz(self, rng, export_dir, tmp_path):
        n = int(os.environ.get("MLA_CONTRACT_FUZZ_CASES", "200"))
        base = json.loads((export_dir / "mla_graph.json").read_text())
        cases = contract_cases(rng, base, n)
        results = run_worker("contract", cases, export_dir, tmp_path)
        path = f"{tmp_path / 'work' / 'export' / 'mla_graph.json'}: "
        problems, loaded = [], 0
        for case, r in zip(cases, results):
            what = f"case {r['i']} ({case['kind']} at {'.'.join(case['path']) or 'bytes'})"
            if r["outcome"] == "ok":
                loaded += 1
            elif r["outcome"] == "timeout":
                problems.append(f"{what}: {r['message']}")
            elif r["type"] != "ContractError":
                problems.append(f"{what}: {r['type']}: {r['message'][:200]}\n{r.get('traceback', '')[-1200:]}")
            elif not r["message"].startswith(path):
                problems.append(f"{what}: the error does not start with the file's path: {r['message'][:300]}")
            elif case["names"] and not any(name in r["message"] for name in case["names"]):
                problems.append(f"{what}: the error names no key of {case['path']}: {r['message'][:300]}")
            elif r["seconds"] > FAST_SECONDS:
                problems.append(f"{what}: took {r['seconds']} s")
        print(f"{len(cases)} contract cases: {loaded} loaded, {len(cases) - loaded - len(problems)} refused, "
              f"{len(problems)} problems")
        assert not problems, "\n".join(problems[:10])
