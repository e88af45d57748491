"""`mla-export verify OUT_DIR`: read every byte of an export's files and compare each with the
digest recorded at export time (mla_graph.json, export.files); one line per file, every
mismatch reported (not only the first), exit 1 when any file differs.

Also `add_verify_flag(parser)`: the `--verify sampled|full|none` option of the commands that
load an export (generate, chat, serve)."""

from __future__ import annotations

import argparse
import sys
import time

EXIT_USAGE = 2
EXIT_MISMATCH = 1


def add_verify_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", choices=("sampled", "full", "none"), default=None,
                   help="check the export's files against the digests recorded at export before loading: sampled "
                        "(default; ~4 MiB read per file), full (every byte, at disk speed: what `mla-export verify` "
                        "does) or none (also loads an export that records no digests); default $MLA_EXPORT_VERIFY "
                        "or sampled")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("verify", help="check every byte of an export against the digests recorded at export",
                              description=__doc__.splitlines()[0])
    p.add_argument("out_dir", metavar="OUT_DIR", help="a directory written by `mla-export export`")
    p.add_argument("--sampled", action="store_true",
                   help="only the sampled digests (~4 MiB per file, what every load checks), not every byte")
    p.add_argument("--threads", type=int, default=None,
                   help="hash threads (default: up to 4, the CPUs this process may use)")
    return p


def run(args) -> int:
    from pathlib import Path

    from mla_export.formats.contract import CONTRACT_FILE, read_contract, validate_contract
    from mla_export.formats.contract_error import ContractError
    from mla_export.formats.export_files import FULL_DIGEST_ALGORITHM, default_threads, verify_files

    if args.threads is not None and args.threads < 1:
        print(f"mla-export verify: --threads must be a positive integer, got {args.threads}", file=sys.stderr)
        return EXIT_USAGE
    out_dir = Path(args.out_dir)
    if not out_dir.is_dir():
        print(f"mla-export verify: {out_dir}: not a directory (expected the output of `mla-export export`)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        # The contract's structure first; the files are checked below, every mismatch reported.
        raw = read_contract(out_dir)
        validate_contract(raw)
    except (ContractError, ValueError) as e:
        print(f"mla-export verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    listed = sorted({f for f in raw["files"].values() if f} | ({raw["tokenizer"]["file"]} if raw["tokenizer"] else set())
                    | {f for f in ((raw.get("mtp") or {}).get("files") or {}).values() if f})  # the MTP draft's
    mode = "sampled" if args.sampled else "full"
    threads = args.threads or default_threads()
    start = time.perf_counter()
    try:
        problems = verify_files(out_dir, raw["export"].get("files"), listed, mode, threads)
    except (ContractError, ValueError) as e:
        print(f"mla-export verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"mla-export verify: {e.strerror or e} ({e.filename or out_dir})", file=sys.stderr)
        return EXIT_MISMATCH
    seconds = time.perf_counter() - start
    bad = {p.split(":", 1)[0] for p in problems}
    total = 0
    for name in listed:
        path = out_dir / name
        size = path.stat().st_size if path.is_file() else 0
        total += size
        if name not in bad:
            print(f"ok        {name} ({size:,} bytes)")
    for p in problems:
        print(f"MISMATCH  {p}")
    what = f"every byte, {FULL_DIGEST_ALGORITHM}" if mode == "full" else "sampled digests"
    rate = f", {total / seconds / 1e9:.2f} GB/s" if seconds > 0 and mode == "full" else ""
    verdict = f"{len(bad)} of {len(listed)} file(s) differ" if problems else f"all {len(listed)} file(s) match"
    print(f"{out_dir / CONTRACT_FILE}: {verdict} ({what}; {total / 1e9:.3f} GB in {seconds:.2f} s{rate}, "
          f"{threads} thread(s))")
    return EXIT_MISMATCH if problems else 0
