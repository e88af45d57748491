"""The package's layering (.importlinter, issue 38): `lint-imports` keeps the contract, the check
can fail, every package and root module is placed in a layer, and the root holds at most 5 modules."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".importlinter"
PACKAGE = ROOT / "mla_export"


def lint(config: Path) -> subprocess.CompletedProcess:
    """`lint-imports --config CONFIG --no-cache` on this checkout's sources (the checkout first on
    the path, so that no installed copy of the package is the one checked)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def layer_lines() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(CONFIG)
    return [line.strip() for line in cfg["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]


class TestContractKept:
    def test_lint_imports_passes(self):
        proc = lint(CONFIG)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 broken" in proc.stdout, proc.stdout


class TestContractCanBreak:
    """The same graph against the layers turned upside down is refused: the check is a real one."""

    def test_reversed_layers_are_broken(self, tmp_path):
        cfg = configparser.ConfigParser()
        cfg.read(CONFIG)
        cfg["importlinter:contract:layers"]["layers"] = "\n" + "\n".join(reversed(layer_lines()))
        config = tmp_path / "reversed.ini"
        with open(config, "w") as f:
            cfg.write(f)
        proc = lint(config)
        assert proc.returncode != 0, proc.stdout
        assert "BROKEN" in proc.stdout, proc.stdout


class TestEveryModulePlaced:
    def test_each_package_and_root_module_is_in_a_layer(self):
        named = {name.strip() for line in layer_lines() for name in line.replace(":", "|").split("|")}
        children = {f"mla_export.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
        children |= {f"mla_export.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
        assert children - named == set(), f"not placed in .importlinter's layers: {sorted(children - named)}"

    def test_root_holds_at_most_five_modules(self):
        modules = sorted(p.name for p in PACKAGE.glob("*.py"))
        assert len(modules) <= 5, modules
