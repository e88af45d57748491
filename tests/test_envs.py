"""mla_export/envs.py is the one table of environment variables: the Python package reads none
elsewhere, every getenv of the C++ sources is in it, docs/ENVIRONMENT.md lists exactly it, and a
value that does not parse is refused naming the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mla_export import envs

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mla_export"


class TestOneTable:
    def test_python_reads_no_variable_elsewhere(self):
        read = re.compile(r"os\.(environ\.get|getenv)\(\s*[\"'](MLA_|VLLM_)|os\.environ\[\s*[\"'](MLA_|VLLM_)")
        offenders = [f"{p.relative_to(REPO)}:{i}" for p in PACKAGE.rglob("*.py") if p.name != "envs.py"
                     for i, line in enumerate(p.read_text().splitlines(), 1) if read.search(line)]
        assert not offenders, f"read through mla_export.envs instead: {offenders}"

    def test_every_kernel_getenv_is_in_the_table(self):
        names = set()
        for p in (REPO / "custom_ops").rglob("*.[ch]pp"):
            text = p.read_text()
            names |= set(re.findall(r"getenv\(\s*\"([A-Z0-9_]+)\"", text))
            for const in re.findall(r"getenv\(\s*(k[A-Za-z]+)\s*\)", text):  # a named constant
                names |= set(re.findall(rf"{const}\s*=\s*\"([A-Z0-9_]+)\"", text))
        assert names, "no getenv found: the pattern no longer matches the sources"
        missing = sorted(n for n in names if n not in envs.VARIABLES or envs.VARIABLES[n].reader != "kernels")
        assert not missing, f"kernel variables missing from envs.py (reader 'kernels'): {missing}"

    def test_docs_list_exactly_the_table(self):
        doc = (REPO / "docs" / "ENVIRONMENT.md").read_text()
        listed = re.findall(r"^\| `([A-Z0-9_]+)` \|", doc, re.M)
        assert listed == list(envs.VARIABLES), "docs/ENVIRONMENT.md and mla_export/envs.py differ"

    def test_the_kernels_read_one_variable_once(self):
        """One getenv in all of custom_ops/kernels (the switchboard's, kernel_config.cpp)."""
        calls = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "custom_ops" / "kernels").rglob("*.[ch]pp")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "getenv(" in line]
        assert calls == ["custom_ops/kernels/kernel_config.cpp:" + calls[0].rsplit(":", 1)[1]], calls

    def test_retired_variables_are_documented_and_not_read(self):
        doc = (REPO / "docs" / "ENVIRONMENT.md").read_text()
        for name in envs.RETIRED:
            assert name not in envs.VARIABLES
            assert f"`{name}=" in doc, f"docs/ENVIRONMENT.md does not say {name} is retired"


class TestValues:
    def test_read_when_used(self, monkeypatch):
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        assert envs.VLLM_BATCH_INVARIANT is True
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
        assert envs.VLLM_BATCH_INVARIANT is False
        monkeypatch.delenv("VLLM_BATCH_INVARIANT")
        assert envs.VLLM_BATCH_INVARIANT is False

    @pytest.mark.parametrize("name,bad", [("MLA_EXPORT_WEIGHTS_MMAP", "yes"), ("VLLM_BATCH_INVARIANT", "true"),
                                          ("MLA_EXPORT_VERIFY", "fast")])
    def test_a_value_that_does_not_parse_names_the_variable(self, monkeypatch, name, bad):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=rf"^{name} must be .*got '{bad}'"):
            envs.get(name)

    def test_stats_interval_is_lenient_as_vllm(self, monkeypatch):
        monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "soon")
        assert envs.VLLM_LOG_STATS_INTERVAL == 10.0
        monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "2.5")
        assert envs.VLLM_LOG_STATS_INTERVAL == 2.5

    def test_unknown_name(self):
        with pytest.raises(AttributeError):
            envs.MLA_EXPORT_NOT_A_VARIABLE  # noqa: B018
