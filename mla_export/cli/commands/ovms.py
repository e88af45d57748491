"""`mla-export ovms OUT_DIR --repo DIR [--name NAME]`: an OpenVINO Model Server model repository.

Layout written (a repository may hold several models; config.json lists them all):

    DIR/config.json                    OVMS config: model_config_list (name, base_path, CPU, plugin_config)
    DIR/README.md                      the exact OVMS command lines (docker and bare metal)
    DIR/run_ovms.sh                    the bare-metal command line as a script
    DIR/extensions/libmla_export_ov.so the MLA ops (OVMS loads it with --cpu_extension)
    DIR/<name>/<version>/openvino_model.xml/.bin   the IR (OVMS serves the highest version)
    DIR/metadata/<name>/mla_graph.json (+ tokenizer.json)  the graph contract, for clients

OVMS takes a CPU extension only on its command line (`--cpu_extension PATH`), not in
config.json, so the command lines are written next to the config. OVMS itself cannot run here:
this command checks that the IR reads with the extension in this OpenVINO, the layout and the
config contents; serving it in OVMS is untested (see docs/SERVING.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

EXT_NAME = "libmla_export_ov.so"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class OVMSLayoutError(ValueError):
    pass


def add_parser(subparsers):
    p = subparsers.add_parser(
        "ovms", help="lay out an OpenVINO Model Server model repository from an export directory",
        description="Lay out an OpenVINO Model Server (OVMS) model repository from an `mla-export export` "
                    "directory: the IR under <repo>/<name>/<version>/, the MLA extension library, a config.json "
                    "and a README with the OVMS command line (--cpu_extension).")
    p.add_argument("out_dir", metavar="OUT_DIR", help="a directory written by `mla-export export` (with the OpenVINO IR)")
    p.add_argument("--repo", required=True, help="the model repository directory (created or updated)")
    p.add_argument("--name", default=None, help="model name in OVMS (default: OUT_DIR's name)")
    p.add_argument("--version", type=int, default=1, help="model version directory (default 1)")
    p.add_argument("--precision", choices=("bf16", "f32"), default="bf16",
                   help="INFERENCE_PRECISION_HINT in the model's plugin_config (default bf16)")
    p.add_argument("--extension", default=None,
                   help="the extension library to copy (default: the installed libmla_export_ov.so)")
    p.add_argument("--force", action="store_true", help="replace an existing <name>/<version>")
    p.add_argument("--no-check", action="store_true",
                   help="skip reading the IR with the extension (the check needs openvino)")
    return p


def run(args) -> int:
    try:
        info = layout_ovms_repo(args.out_dir, args.repo, name=args.name, version=args.version,
                                precision=args.precision, extension=args.extension, force=args.force,
                                check=not args.no_check)
    except (OVMSLayoutError, FileNotFoundError) as e:
        print(f"mla-export ovms: {e}", file=sys.stderr)
        return 2
    print(f"OVMS repository {info['repo']}: model '{info['name']}' version {info['version']}")
    print(f"  IR:        {info['xml']}")
    print(f"  extension: {info['extension']}")
    print(f"  config:    {info['config']}")
    print(f"  run:       {info['command']}")
    return 0


def _contract(out_dir: Path) -> dict:
    from mla_export.formats.contract_error import ContractError
    from mla_export.formats.contract import load_contract

    try:
        return load_contract(out_dir).raw
    except ContractError as e:
        raise OVMSLayoutError(str(e)) from None


def ovms_command(repo: Path, *, docker: bool, rest_port: int = 8000, grpc_port: int = 9000) -> str:
    if docker:
        return (f"docker run --rm -p {grpc_port}:{grpc_port} -p {rest_port}:{rest_port} -v {repo}:/models:ro "
                f"openvino/model_server:latest --config_path /models/config.json "
                f"--cpu_extension /models/extensions/{EXT_NAME} --port {grpc_port} --rest_port {rest_port}")
    return (f"ovms --config_path {repo}/config.json --cpu_extension {repo}/extensions/{EXT_NAME} "
            f"--port {grpc_port} --rest_port {rest_port}")


def layout_ovms_repo(out_dir, repo, *, name: str | None = None, version: int = 1, precision: str = "bf16",
                     extension: str | None = None, force: bool = False, check: bool = True) -> dict:
    out_dir = Path(out_dir).resolve()
    repo = Path(repo).resolve()
    if not out_dir.is_dir():
        raise OVMSLayoutError(f"{out_dir} is not a directory written by `mla-export export`")
    raw = _contract(out_dir)
    files = raw["files"]
    if not files.get("openvino_xml") or not files.get("openvino_bin"):
        raise OVMSLayoutError(f"{out_dir} has no OpenVINO IR (export with --format openvino or both); "
                              "OVMS serves the IR with the extension")
    xml, binf = out_dir / files["openvino_xml"], out_dir / files["openvino_bin"]
    name = name or out_dir.name
    if not _NAME_RE.match(name) or name in ("extensions", "metadata"):
        raise OVMSLayoutError(f"invalid model name {name!r}: letters, digits, '_', '-', '.'; not 'extensions'/'metadata'")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise OVMSLayoutError(f"the version must be an integer >= 1, got {version!r}")
    if precision not in ("bf16", "f32"):
        raise OVMSLayoutError(f"precision must be bf16 or f32, got {precision!r}")
    if extension is None:
        from mla_export.ops.libraries import extension_path

        extension = extension_path()
    extension = Path(extension)
    if not extension.is_file():
        raise FileNotFoundError(f"extension library not found: {extension}")
    if check:
        # The same check OVMS makes first: the IR must read with the extension's op types.
        from mla_export.ops.libraries import ov_core

        try:
            ov_core().read_model(str(xml))
        except Exception as e:
            raise OVMSLayoutError(f"the IR does not read with the MLA extension: {e}") from None

    version_dir = repo / name / str(version)
    if version_dir.exists() and not force:
        raise OVMSLayoutError(f"{version_dir} exists (use --force to replace it)")
    repo.mkdir(parents=True, exist_ok=True)
    config_path = repo / "config.json"
    config = {"model_config_list": []}
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text())
            if not isinstance(config.get("model_config_list"), list):
                raise ValueError("no model_config_list")
        except (ValueError, json.JSONDecodeError) as e:
            raise OVMSLayoutError(f"{config_path} is not an OVMS config ({e}); move it away first") from None

    # Stage the new version next to its final place, then move it in: never half-written.
    (repo / name).mkdir(exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=repo / name))
    try:
        shutil.copy2(xml, stage / xml.name)
        shutil.copy2(binf, stage / binf.name)
        if version_dir.exists():
            shutil.rmtree(version_dir)
        os.replace(stage, version_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise

    ext_dir = repo / "extensions"
    ext_dir.mkdir(exist_ok=True)
    ext_dst = ext_dir / EXT_NAME
    tmp = ext_dir / f".{EXT_NAME}.tmp"
    shutil.copy2(extension, tmp)
    os.replace(tmp, ext_dst)

    meta = repo / "metadata" / name
    meta.mkdir(parents=True, exist_ok=True)
    meta_contract = json.loads(json.dumps(raw))
    # The contract lists the files of the export dir; here only the IR (in <name>/<version>/)
    # and the tokenizer (beside it) exist.
    meta_contract["files"] = {k: (v if k in ("openvino_xml", "openvino_bin") else None) for k, v in files.items()}
    # An MTP draft is not laid out: speculative decoding needs the KV cache kept between steps,
    # which OVMS does not keep (README below), so the contract lists no draft a client could not find.
    meta_contract["mtp"] = None
    tok = raw.get("tokenizer")
    if tok and tok.get("file"):
        shutil.copy2(out_dir / tok["file"], meta / Path(tok["file"]).name)
    (meta / "mla_graph.json").write_text(json.dumps(meta_contract, indent=2) + "\n")

    entry = {"config": {
        "name": name,
        "base_path": name,  # relative to config.json
        "target_device": "CPU",
        "plugin_config": {"INFERENCE_PRECISION_HINT": precision},
    }}
    lst = [m for m in config["model_config_list"] if m.get("config", {}).get("name") != name]
    lst.append(entry)
    config["model_config_list"] = lst
    tmp = repo / ".config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, config_path)

    cmd = ovms_command(repo, docker=False)
    script = repo / "run_ovms.sh"
    script.write_text("#!/bin/sh\n# OpenVINO Model Server with the MLA ops (written by `mla-export ovms`).\n"
                      "# OVMS takes the extension on its command line only; config.json cannot name it.\n"
                      f"exec {cmd} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    models = [m["config"]["name"] for m in lst]
    (repo / "README.md").write_text(_readme(repo, models, raw))
    return {"repo": str(repo), "name": name, "version": version, "xml": str(version_dir / xml.name),
            "extension": str(ext_dst), "config": str(config_path), "command": cmd}


def _index_note(cache: dict) -> str:
    """A sparse-attention model's indexer-key caches, for the README's list of inputs."""
    index = cache.get("index")
    if not index:
        return ""
    return (f", then one indexer-key cache per indexer layer (`index_cache.0` .. `index_cache.{index['num_layers'] - 1}`, "
            f"`[num_blocks, {cache.get('block_size')}, {index['graph_row_width']}]` {index['graph_dtype']})")


def _mtp_note(raw: dict) -> str:
    """The README's word on an export's MTP draft, which the repository leaves out."""
    if not raw.get("mtp"):
        return ""
    return ("\n\nThe export's MTP draft graph (speculative decoding) is not in this repository: drafting and\n"
            "verifying need the KV cache kept from step to step, which OVMS does not keep; `mla-export serve\n"
            "--speculative-config '{\"method\": \"mtp\"}'` runs it. The metadata contract lists no draft.")


def _readme(repo: Path, models: list[str], raw: dict) -> str:
    import openvino  # noqa: F401  (the version the extension was built against)

    ov_version = getattr(openvino, "__version__", "?").split("-")[0]
    sonames = sorted(p.name for p in (Path(openvino.__file__).parent / "libs").glob("libopenvino.so.*"))
    soname = sonames[0] if sonames else "libopenvino.so of that release"
    docker = ovms_command(Path("$PWD"), docker=True).replace("-v $PWD:/models", '-v "$PWD":/models')
    model = raw.get("model", {})
    cache = raw.get("cache", {})
    return f"""# OpenVINO Model Server repository (written by `mla-export ovms`)

Models: {", ".join(models)}. Each is an OpenVINO IR with the MLA custom ops (opset `mla_export`),
served on CPU.

## Run

OVMS loads custom-op libraries only through its `--cpu_extension` command-line option (its
config.json has no field for it). From this directory:

Bare metal (an `ovms` binary on PATH):

    {ovms_command(repo, docker=False)}

Docker (the repository mounted at /models):

    {docker}

`./run_ovms.sh` runs the bare-metal line.

## Requirements

- The extension was built against OpenVINO {ov_version} (it needs `libopenvino.so` of that
  release, SONAME `{soname}`): use an OVMS release built on the
  same OpenVINO version (replace `latest` in the docker line by that release's tag), or rebuild
  `custom_ops/` against the OVMS image's OpenVINO.
- CPU only (`target_device: CPU`); `plugin_config` sets the inference precision.

## What OVMS serves, and what it does not

OVMS runs the graph one request at a time over its KServe v2 / TFS APIs (REST port, gRPC
port). The graph's inputs are the step's metadata (`input_ids`, `positions`, `slot_mapping`,
`query_start_loc`, `seq_lens`, `block_tables`, `logits_indices`) and one KV cache per layer
(`kv_cache.0` .. `kv_cache.{int(model.get("num_layers", 1)) - 1}`, `[num_blocks, {cache.get("block_size")}, row]`, dtype as in the contract{_index_note(cache)});
the output is `logits [B, vocab]`. The ops write the cache *in place* into the request's input
tensor, which OVMS discards after the call: OVMS keeps no KV cache between requests. A client
can score a whole prompt in one call (prefill with a zeroed cache gives the next-token logits),
and generate by resending the full sequence each step; it cannot reuse the cache across calls.
For generation with a persistent paged cache, continuous batching and prefix caching, use
`mla-export serve` (OpenAI-compatible API).

`metadata/<name>/mla_graph.json` is the graph contract (every input's shape and dtype, the
model facts) and the tokenizer, for clients.{_mtp_note(raw)}

This layout was checked by `mla-export` (the IR reads with the extension; the config and the
files are as above). OVMS itself was not run when this repository was written.
"""
