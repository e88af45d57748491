"""The cache-format registry (issue 38 step 3): one list of latent-cache row formats per
language (mla_export/formats/kv_formats.py FORMATS, custom_ops/kernels/cache_formats.hpp CacheFormats)
from which the contract, the CLI choices and the kernels' dispatch derive, so a quantised cache
format is named nowhere else in the package and the kernels (docs/KERNELS.md: adding one)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from mla_export.formats import kv_formats

REPO = Path(__file__).resolve().parents[1]
REGISTRY_FILES = {"mla_export/formats/kv_formats.py", "custom_ops/kernels/cache_formats.hpp"}

# Where "fp8" names the *weight* format (`--weight-format fp8`, e4m3 weight codes, FP8 checkpoints),
# not the cache's: the exporter's weight code, the integer/fp8 GEMM kernels, the weight memory
# estimates and the benchmarks' export labels. On these files' fp8 lines the cache must not come
# up (CACHE_WORDS), so a cache branch added there still fails.
WEIGHT_FORMAT_FILES = (
    "mla_export/export/*.py", "mla_export/checkpoint/reader.py", "mla_export/checkpoint/fp8.py", "mla_export/checkpoint/config.py", "mla_export/bench/*.py",
    "mla_export/cli/commands/export.py", "mla_export/ops/memory_plan.py", "mla_export/runtime/batch_invariance.py",
    "custom_ops/kernels/moe_*", "custom_ops/kernels/qmatmul*", "custom_ops/kernels/qlinear*",
    "custom_ops/kernels/qgemm*", "custom_ops/kernels/fp8_bf16.hpp", "custom_ops/CMakeLists.txt",
    "mla_export/formats/weight_format.py", "custom_ops/kernels/weight_format.hpp",  # the weight-format tables
    "custom_ops/kernels/cpu_features.hpp", "custom_ops/kernels/kernel_config.*",  # which fp8-weight kernels run
    "mla_export/ops/kernel_config.py", "mla_export/runtime/qlinear_tiles.py",  # which weight formats lie in tiles
)
CACHE_WORDS = re.compile(r"kv|cache|KvDtype|QUANTISED|scale_groups|SCALE_GROUPS|row_bytes", re.IGNORECASE)
CACHE_NAME = "fp8"  # the quantised cache format the issue traces (also a weight format, hence the list above)


def _sources():
    for top, pattern in (("mla_export", "*.py"), ("custom_ops", "*.hpp"), ("custom_ops", "*.cpp"),
                         ("custom_ops", "CMakeLists.txt")):
        for p in sorted((REPO / top).rglob(pattern)):
            rel = p.relative_to(REPO).as_posix()
            if "/build" not in rel and rel not in REGISTRY_FILES:
                yield rel, p.read_text(errors="replace")


def _mentions(text: str):
    word = re.compile(rf"\b{CACHE_NAME}\b")
    return [(i, line) for i, line in enumerate(text.splitlines(), 1) if word.search(line)]


class TestCacheFormatNamedOnlyInTheRegistry:
    """Outside the two registries (and the schema, tests and docs, which are not scanned), the
    cache format's name appears only where it names the weight format, never next to the cache."""

    def test_no_file_outside_the_registry_names_it_as_a_cache_format(self):
        stray, cache_lines = [], []
        for rel, text in _sources():
            lines = _mentions(text)
            if not lines:
                continue
            if not any(fnmatch.fnmatch(rel, pat) for pat in WEIGHT_FORMAT_FILES):
                stray.append(f"{rel}:{lines[0][0]}: {lines[0][1].strip()}")
            cache_lines += [f"{rel}:{i}: {line.strip()}" for i, line in lines if CACHE_WORDS.search(line)]
        assert not stray, ("the cache format is named outside its registry (derive it from kv_formats.FORMATS / "
                           "cache_formats.hpp, or add the file to WEIGHT_FORMAT_FILES if fp8 is the weight "
                           "format there):\n" + "\n".join(stray))
        assert not cache_lines, "fp8 next to the cache outside the registry:\n" + "\n".join(cache_lines)

    def test_the_scan_sees_the_registries_and_the_weight_files(self):
        # A scan that found nothing would pass vacuously: the registries name the format, and the
        # weight-format files it excuses do exist and still name it.
        for rel in REGISTRY_FILES:
            assert _mentions((REPO / rel).read_text()), rel
        seen = {rel for rel, text in _sources() if _mentions(text)}
        for pat in ("mla_export/export/*.py", "mla_export/checkpoint/reader.py", "custom_ops/kernels/qmatmul*"):
            assert any(fnmatch.fnmatch(rel, pat) for rel in seen), pat


class TestTheTwoRegistriesAgree:
    """The C++ traits list and the Python FORMATS hold the same formats with the same scale groups."""

    def test_names_and_groups(self):
        text = (REPO / "custom_ops/kernels/cache_formats.hpp").read_text()
        traits = dict(re.findall(r"struct (\w+) : \w+<KvDtype::\w+, [^>]*>\s*\{\s*static constexpr const char\* "
                                 r"name = \"(\w+)\"", text))
        listed = re.search(r"using CacheFormats = FormatList<([^>]*)>;", text).group(1)
        names = [traits[t.strip()] for t in listed.split(",")]
        assert names == list(kv_formats.KV_DTYPES)
        groups = re.findall(r"QuantisedRows<KvDtype::\w+, \w+, (\d+)> \{\s*static constexpr const char\* "
                            r"name = \"(\w+)\"", text)
        assert {n: int(g) for g, n in groups} == \
            {n: f.groups for n, f in kv_formats.FORMATS.items() if f.quantised}


class TestEverythingDerivesFromTheRegistry:
    def test_cli_choices(self):
        import argparse

        from mla_export.cli.commands import export as export_cmd
        parser = argparse.ArgumentParser()
        export_cmd.add_parser(parser.add_subparsers())
        sub = parser._subparsers._group_actions[0].choices["export"]
        action = next(a for a in sub._actions if "--kv-dtype" in a.option_strings)
        assert tuple(action.choices) == kv_formats.KV_DTYPES

    def test_contract_layouts(self):
        from mla_export.formats.contract import CACHE_DTYPES, PORTABLE_CACHE_DTYPES, cache_layout
        assert CACHE_DTYPES == kv_formats.KV_DTYPES
        assert set(PORTABLE_CACHE_DTYPES) == {n for n, f in kv_formats.FORMATS.items() if not f.quantised}
        for name, f in kv_formats.FORMATS.items():
            dtype, width, _ = cache_layout(name, 576, 512)
            assert width == kv_formats.graph_width(name, 512, 64), name
            assert dtype == f.graph_dtype

    def test_exporter_formats(self):
        from mla_export.export.exporter import KV_DTYPES
        assert tuple(KV_DTYPES) == kv_formats.KV_DTYPES

    def test_unknown_names_are_refused_with_the_registry_listed(self):
        with pytest.raises(ValueError, match=", ".join(kv_formats.KV_DTYPES)):
            kv_formats.cache_format("fp4")
