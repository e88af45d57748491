"""The built wheel installs and runs with no compiler (issue 37).

tools/build_wheel.sh builds the wheel (py3-none-manylinux, both libraries inside, checked by
tools/check_wheel.py); tools/install_wheel.sh installs it with its real dependencies from the
package index into a fresh venv, run with a PATH that holds only that venv and a few coreutils
(no cc, c++, cmake or ninja: asserted); the installed `mla-export` then exports the tiny preset,
generates on OpenVINO and on onnxruntime (each through its library from the wheel) and serves.
The same two scripts are the Dockerfile's build steps (TestDockerfile checks that).

Slow: the first build compiles the C++ (2-4 minutes on 2 cores; build/wheel is reused after), the
install downloads openvino and the other dependencies (about 40 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server_helpers import free_port, start_serve_command

REPO = Path(__file__).resolve().parent.parent
# What would let pip (or a build backend it ran) compile anything.
BUILD_TOOLS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "cmake", "ninja", "make", "ld")
# A minimal system's tools; none of them compiles.
COREUTILS = ("cat", "cp", "env", "ls", "mkdir", "mv", "rm", "uname")
# Variables that could point the fresh install at this checkout, its libraries or a compiler.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MLA_EXPORT_LIB_DIR", "CC", "CXX", "CPP", "LD",
               "CFLAGS", "CXXFLAGS", "LDFLAGS", "CMAKE_GENERATOR", "CMAKE_MAKE_PROGRAM", "CMAKE_ARGS")
PROMPT = "The quick brown fox"


class FreshInstall:
    """A venv holding the installed wheel, and the compiler-free environment to run it in."""

    def __init__(self, root: Path, wheel: Path):
        self.root = root
        self.venv = root / "venv"
        tools = root / "coreutils"
        tools.mkdir()
        for name in COREUTILS:
            found = shutil.which(name)
            if found:
                (tools / name).symlink_to(found)
        self.path = f"{self.venv / 'bin'}{os.pathsep}{tools}"
        self.env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        self.env.update(PATH=self.path, PYTHONUNBUFFERED="1")
        # The venv is made with the full PATH (making one compiles nothing); the install is not.
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=300)
        self.assert_no_build_tools()
        self.install_log = self.run(["/bin/bash", str(REPO / "tools" / "install_wheel.sh"), str(self.venv), str(wheel)],
                                    timeout=1800)

    def assert_no_build_tools(self):
        reachable = {t: shutil.which(t, path=self.path) for t in BUILD_TOOLS}
        assert not any(reachable.values()), f"build tools reachable on the fresh install's PATH: {reachable}"

    def run(self, cmd: list[str], timeout: float = 600) -> str:
        """Run in the compiler-free environment, from outside the checkout (so `import mla_export`
        can only find the installed package); returns stdout, fails with stderr."""
        proc = subprocess.run(cmd, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
        return proc.stdout

    def mla_export(self, *args: str) -> str:
        return self.run([str(self.venv / "bin" / "mla-export"), *args])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """tools/build_wheel.sh's wheel, built from this checkout (build/wheel's CMake tree is reused)."""
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(["bash", str(REPO / "tools" / "build_wheel.sh"), str(dist)], cwd=REPO,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"tools/build_wheel.sh failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == dist, f"build_wheel.sh printed {path}, not a wheel in {dist}"
    return path


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> FreshInstall:
    return FreshInstall(tmp_path_factory.mktemp("fresh"), wheel)


@pytest.mark.slow
class TestWheel:
    def test_tag_says_any_python_and_a_manylinux_platform(self, wheel):
        assert re.fullmatch(r"mla_export-[^-]+-py3-none-manylinux_\d+_\d+_x86_64\.whl", wheel.name), wheel.name


@pytest.mark.slow
class TestCompilerFreeInstall:
    def test_nothing_was_compiled(self, fresh):
        fresh.assert_no_build_tools()  # nor did the install bring cmake or ninja into the venv
        built = re.findall(r"Building wheel for \S+", fresh.install_log)
        assert not built, f"pip built from source: {built}"
        assert "Successfully installed" in fresh.install_log and "mla-export-" in fresh.install_log

    def test_package_and_libraries_are_the_installed_ones(self, fresh):
        out = fresh.run([str(fresh.venv / "bin" / "python"), "-c",
                         "import json, mla_export as m; "
                         "print(json.dumps([m.__file__, m.extension_path(), m.ort_ops_path()]))"])
        site = fresh.venv / "lib"
        for path in json.loads(out):
            assert path and Path(path).resolve().is_relative_to(site.resolve()), f"{path} is not from {site}"

    def test_export_then_generate_on_openvino(self, fresh):
        out = fresh.root / "tiny"
        fresh.mla_export("export", "--preset", "tiny", "-o", str(out))
        assert (out / "openvino_model.xml").is_file()
        assert fresh.mla_export("generate", str(out), "--prompt", PROMPT, "--max-tokens", "8").strip()
        report = json.loads(fresh.mla_export("generate", str(out), "--prompt", PROMPT, "--max-tokens", "8",
                                             "--ignore-eos", "--json"))
        assert len(report["token_ids"]) == 8 and report["finish_reason"] == "length", report
        assert report["runtime"].lower().startswith("openvino"), report["runtime"]

    def test_export_then_generate_on_onnxruntime(self, fresh):
        out = fresh.root / "tiny-onnx"
        fresh.mla_export("export", "--preset", "tiny", "--format", "onnx", "-o", str(out))
        report = json.loads(fresh.mla_export("generate", str(out), "--prompt", PROMPT, "--max-tokens", "8",
                                             "--ignore-eos", "--json", "--runtime", "onnxruntime"))
        assert len(report["token_ids"]) == 8 and report["finish_reason"] == "length", report
        assert "mla_export custom-op library" in report["runtime"], report["runtime"]

    def test_serve_answers_a_completion(self, fresh):
        """The container's command, `mla-export serve`, from the installed wheel."""
        out = fresh.root / "tiny-serve"
        fresh.mla_export("export", "--preset", "tiny", "-o", str(out))
        port = free_port()
        proc, base = start_serve_command([str(fresh.venv / "bin" / "mla-export"), "serve", str(out), "--port", str(port)],
                                         port, fresh.root, fresh.env, "the installed mla-export serve")
        try:
            r = httpx.post(f"{base}/v1/completions", timeout=300,
                           json={"model": out.name, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4, r.json()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class TestDockerfile:
    """The container recipe builds and installs with the scripts tested above, and its runtime
    stage carries no compiler. (No docker daemon runs in CI: the recipe itself is not built here.)"""

    def stages(self) -> list[list[str]]:
        text = (REPO / "Dockerfile").read_text()
        # Instructions with their continuation lines joined; comments dropped.
        lines = [ln for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        stages: list[list[str]] = []
        for ln in lines:
            if ln.split()[0].upper() == "FROM":
                stages.append([])
            if stages:
                stages[-1].append(ln.strip())
        return stages

    def test_build_stage_runs_build_wheel(self):
        build = self.stages()[0]
        assert any(ln.startswith("RUN") and "tools/build_wheel.sh" in ln for ln in build), build

    def test_runtime_stage_runs_install_wheel_and_serve(self):
        runtime = self.stages()[-1]
        assert any(ln.startswith("RUN") and "tools/install_wheel.sh" in ln for ln in runtime), runtime
        entry = " ".join(ln for ln in runtime if ln.split()[0].upper() in ("ENTRYPOINT", "CMD"))
        assert "mla-export" in entry and "serve" in entry, entry

    def test_runtime_stage_installs_no_compiler(self):
        runtime = " ".join(ln for ln in self.stages()[-1] if ln.startswith("RUN"))
        packages = " ".join(re.findall(r"apt-get (?:-\S+ )*install([^&;|]*)", runtime)).split()
        found = [p for p in packages if re.match(r"(build-essential|g\+\+|gcc|clang|cmake|ninja|make)\b", p)]
        assert not found, f"the runtime stage installs build tools: {found}"
