"""The export's progress: one display over every phase, with an ETA.

The phases are weighed by the checkpoint bytes they process, read from the safetensors headers
before any work starts: each decoder layer its own tensors (a MoE layer weighs many times a
dense one), the embedding and lm_head theirs, and the OpenVINO IR conversion (reading the ONNX
graph with its weights and saving the IR: silent, one call) `IR_SHARE` of all the weights, as
measured. The ETA is then the display's rate over what is left. `ExportProgress` is what
`export_model` reports to; `TqdmProgress` draws it with tqdm on stderr (a TTY gets a live bar;
the elapsed time keeps moving during the long silent IR call through a refresh thread).
"""

from __future__ import annotations

import sys
import threading

__all__ = ["ExportProgress", "TqdmProgress", "IR_SHARE"]

# The IR conversion's time relative to building the ONNX graph from the same bytes: 0.05 and
# 0.11 in two exports of a 4-layer hidden-1024 MoE checkpoint (f32 weights, 2 threads, other
# jobs on the host) since the IR reuses the ONNX data file as its .bin (0.60-0.76 before, when
# the weights were written a second time).
IR_SHARE = 0.1


class ExportProgress:
    """What export_model reports: `plan(total)` once (units: checkpoint bytes), then
    `advance(units, what)` as phases complete and `phase(what)` when a silent phase starts;
    `note(text)` for a line shown even without a display (stderr)."""

    def plan(self, total: float) -> None:
        pass

    def phase(self, what: str) -> None:
        pass

    def advance(self, units: float, what: str | None = None) -> None:
        pass

    def note(self, text: str) -> None:
        """Something the user must hear of even with no progress display (a stale partial removed)."""
        print(f"mla-export export: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class TqdmProgress(ExportProgress):
    def __init__(self, file=None, refresh_s: float = 0.5):
        from tqdm import tqdm

        self._bar = tqdm(total=None, file=file or sys.stderr, desc="export", leave=True, dynamic_ncols=True,
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(refresh_s,), name="export-progress", daemon=True)
        self._ticker.start()

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            self._bar.refresh()

    def plan(self, total: float) -> None:
        self._bar.reset(total=max(float(total), 1.0))

    def phase(self, what: str) -> None:
        self._bar.set_description_str(what, refresh=True)

    def advance(self, units: float, what: str | None = None) -> None:
        if what is not None:
            self._bar.set_description_str(what, refresh=False)
        self._bar.update(units)

    def note(self, text: str) -> None:
        self._bar.write(f"mla-export export: {text}", file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        self._ticker.join()
        self._bar.close()
