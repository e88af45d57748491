"""Plot the full 27-layer model's decode speed per CPU class (the README's headline figure).

    python tools/plot_full_model.py [docs/figures/full_model_27l.json] [-o docs/figures/full_model_27l.svg]

Reads the figures file (each machine with its date, commit and the commands that measured it;
the numbers are transcribed from docs/BENCHMARKS.md / CHANGELOG.md) and writes an SVG: one group
of bars per machine, batch 1 and batch 8 side by side, a bar per system at the middle of its
range over rounds with the range as a whisker; "n/m" where a figure was not measured. Needs
matplotlib (the `bench` extra). The SVG carries no date or random ids, so an unchanged figures
file gives an unchanged plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "docs" / "figures" / "full_model_27l.json"
COLORS = {"ours int8": "#2471a3", "ours int4 --all-layers": "#5dade2", "llama.cpp Q8_0": "#c0392b"}


def load(path: Path) -> dict:
    try:
        facts = json.loads(path.read_text())
        machines = facts["machines"]
        for m in machines:
            for key in ("cpu_class", "machine", "date", "commit", "systems"):
                m[key]  # noqa: B018 - a missing key is the error below
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_full_model: {path}: not a full-model figures file ({e!r})")
    return facts


def _short(machine: str) -> str:
    """'AMD EPYC Zen 4, 2 cores (...)' -> 'Zen 4'; 'Intel Xeon Emerald Rapids, ...' -> 'Xeon Emerald Rapids'."""
    return machine.split(",")[0].replace("AMD EPYC ", "").replace("Intel ", "")


def plot(facts: dict, out: Path) -> None:
    try:
        import matplotlib
    except ModuleNotFoundError:
        sys.exit("plot_full_model: matplotlib is not installed: pip install 'mla-export[bench]'")
    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "mla-export"  # stable element ids
    import matplotlib.pyplot as plt

    machines = facts["machines"]
    systems = list(COLORS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharey=False)
    for ax, key, title in zip(axes, ("decode_b1", "decode_b8"), ("batch 1", "batch 8")):
        width = 0.8 / len(systems)
        for j, name in enumerate(systems):
            for i, m in enumerate(machines):
                x = i + (j - (len(systems) - 1) / 2) * width
                span = (m["systems"].get(name) or {}).get(key)
                if span is None:
                    ax.text(x, 0.02, "n/m", ha="center", va="bottom", fontsize=7, color="#777",
                            transform=ax.get_xaxis_transform())
                    continue
                lo, hi = span
                mid = (lo + hi) / 2
                ax.bar(x, mid, width, color=COLORS[name], label=name if i == 0 else None,
                       yerr=[[mid - lo], [hi - mid]] if hi > lo else None, capsize=2)
        ax.set_xticks(range(len(machines)))
        ax.set_xlim(-0.5, len(machines) - 0.5)
        ax.set_xticklabels([f"{m['cpu_class']}\n{_short(m['machine'])}\n{m['date'][:10]}\n{m['commit']}"
                            for m in machines], fontsize=7)
        ax.set_title(f"decode tokens/s, {title}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(systems), frameon=False)
    fig.suptitle("DeepSeek-V2-Lite shape, all 27 layers (15.7B), prompt 1024, 2 threads "
                 "(n/m: not measured)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("-o", "--out", type=Path, default=None, help="the SVG (default: the figures file's name, .svg)")
    args = ap.parse_args(argv)
    out = args.out or args.figures.with_suffix(".svg")
    plot(load(args.figures), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
