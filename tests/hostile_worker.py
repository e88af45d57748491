"""Runs hostile cases one after another in a process of its own, for tests/test_hostile_inputs.py.

The test starts it under an address-space limit (RLIMIT_AS) and a timeout, so a regression that
allocates a table sized by a hostile value, or loops over a billion claimed layers, fails the test
instead of taking CI's memory or time. Each case is announced (`start <i>`) before it runs and
answered with one JSON line after, so the test can name the case a killed worker died in; a case
running past its own time limit is stopped by SIGALRM and reported as a timeout.

    python hostile_worker.py config CASES.json CHECKPOINT WORKDIR
    python hostile_worker.py contract CASES.json EXPORT WORKDIR

config cases: {"config": {...}} (a whole config.json). The checkpoint's other files are linked
next to it and `export_model` runs (ONNX only: the IR conversion adds time, not config reading).
contract cases: {"data": base64} (a whole mla_graph.json, any bytes); the export's other files are linked and
`load_model_dir` runs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

CASE_SECONDS = 20


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout(f"still running after {CASE_SECONDS} s")


def _linked_copy(src: Path, dst: Path, replaced: str) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != replaced and f.is_file():
            os.link(f, dst / f.name)


def _config_case(case: dict, checkpoint: Path, work: Path):
    from mla_export.formats.contract import load_contract
    from mla_export.export import export_model

    model = work / "model"
    _linked_copy(checkpoint, model, "config.json")
    (model / "config.json").write_text(json.dumps(case["config"]))
    out = work / "out"
    export_model(model, out, fmt="onnx", overwrite=True)
    load_contract(out)  # a case that exports must export something that loads


def _contract_case(case: dict, export: Path, work: Path):
    from mla_export.runtime.model_dir import load_model_dir

    out = work / "export"
    _linked_copy(export, out, "mla_graph.json")
    (out / "mla_graph.json").write_bytes(base64.b64decode(case["data"]))
    load_model_dir(out)


def main() -> None:
    mode, cases_file, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    run = {"config": _config_case, "contract": _contract_case}[mode]
    cases = json.loads(cases_file.read_text())
    signal.signal(signal.SIGALRM, _alarm)
    import mla_export.export  # noqa: F401  (imports are not the cases' time)
    import mla_export.runtime.model_dir  # noqa: F401

    for i, case in enumerate(cases):
        print(f"start {i}", flush=True)
        t = time.perf_counter()
        result = {"i": i, "outcome": "ok", "type": None, "message": ""}
        signal.alarm(CASE_SECONDS)
        try:
            run(case, source, work)
        except CaseTimeout as e:
            result.update(outcome="timeout", message=str(e))
        except BaseException as e:  # everything is reported: the test decides what is allowed
            result.update(outcome="error", type=type(e).__name__, message=str(e)[:2000],
                          traceback="".join(traceback.format_exception(e))[-3000:])
        finally:
            signal.alarm(0)
        result["seconds"] = round(time.perf_counter() - t, 3)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
