"""The files of an export tied together: each one's size and two digests, recorded in
mla_graph.json (`export.files`) at export time and checked at load, so a graph from another
export, a changed or truncated weights file, or a tokenizer swapped in is a clear error instead
of garbage output.

Two digests, two costs (docs/SAFETY.md has the measured figures):
- `digest`, the sampled one: BLAKE2b over the file's size and 64 evenly spaced 64 KiB samples
  (the whole file when it is smaller than that): about 4 MiB read whatever the file's size, so
  every load checks it. It catches a different or partly rewritten file, not one flipped byte
  between the samples.
- `full_digest`: SHA-256 over the SHA-256 of each 64 MiB chunk in order ("sha256-chunks-64MiB");
  every byte is read. Chunks are hashed on several threads (hashlib and os.preadv release the
  GIL), so it runs at disk speed where one core's SHA-256 (~1.6 GB/s with SHA-NI) is slower than
  the disk. Checked by `mla-export verify OUT` and at load with verify="full".
Neither is a signature: they catch corruption and mix-ups, not a deliberate forgery.

The load-time mode ("sampled" default, "full", "none") comes from the caller or the environment
variable MLA_EXPORT_VERIFY. An export whose contract records no digest for a file it lists is
refused unless the mode is "none": deleting `export.files` must not switch the check off."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import envs

__all__ = ["digest", "full_digest", "describe_files", "check_files", "verify_files", "verify_mode",
           "VERIFY_MODES", "VERIFY_ENV", "FULL_DIGEST_ALGORITHM"]

_SAMPLES = 64
_SAMPLE = 64 << 10
_CHUNK = 64 << 20  # full digest: one SHA-256 per chunk (the unit of parallelism)
_PIECE = 4 << 20  # read size inside a chunk: the memory per thread
FULL_DIGEST_ALGORITHM = "sha256-chunks-64MiB"
VERIFY_MODES = ("sampled", "full", "none")
VERIFY_ENV = "MLA_EXPORT_VERIFY"
# How to load an export anyway, named in every refusal.
OVERRIDE = f"--verify none (verify='none' in Python, {VERIFY_ENV}=none)"


def digest(path: str | Path) -> str:
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= _SAMPLES * _SAMPLE:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            step = (size - _SAMPLE) // (_SAMPLES - 1)
            for i in range(_SAMPLES):
                f.seek(i * step)
                h.update(f.read(_SAMPLE))
    return h.hexdigest()


def default_threads() -> int:
    """Hash threads: enough for a fast disk (4 x ~1.6 GB/s), never more than the CPUs we may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _chunk_hash(fd: int, start: int, end: int) -> bytes:
    h = hashlib.sha256()
    buf = bytearray(min(_PIECE, max(end - start, 1)))
    view = memoryview(buf)
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
        if n == 0:
            raise OSError(f"unexpected end of file at byte {pos} (the file shrank while it was read)")
        h.update(view[:n])
        pos += n
    return h.digest()


def full_digest(path: str | Path, threads: int | None = None) -> str:
    """"sha256-chunks-64MiB:<hex>" of the file (the algorithm named in the value, so a record made
    by another algorithm is told apart from a changed file): every byte read, chunks on `threads` threads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        starts = range(0, max(size, 1), _CHUNK)
        top = hashlib.sha256(size.to_bytes(8, "little"))
        with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
            for part in pool.map(lambda s: _chunk_hash(fd, s, min(s + _CHUNK, size)), starts):
                top.update(part)
        return f"{FULL_DIGEST_ALGORITHM}:{top.hexdigest()}"
    finally:
        os.close(fd)


def describe_files(out_dir: str | Path, names) -> dict:
    """{name: {"size": bytes, "digest": sampled hex, "full_digest": hex}} for the given files of out_dir."""
    out_dir = Path(out_dir)
    return {n: {"size": (out_dir / n).stat().st_size, "digest": digest(out_dir / n),
                "full_digest": full_digest(out_dir / n)} for n in sorted(set(names))}


def verify_mode(mode: str | None) -> str:
    """The load-time check: `mode` if given, else $MLA_EXPORT_VERIFY, else "sampled"."""
    if mode is None:
        return envs.get(VERIFY_ENV) or "sampled"
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    return mode


def _problems(out_dir: Path, name: str, want: dict | None, mode: str, threads: int | None):
    """The mismatches of one listed file (empty: it is the file the export wrote)."""
    from .export_paths import inside

    path = inside(out_dir, name, "export.files")
    if not path.is_file():
        return [f"{name}: missing (mla_graph.json lists it)"]
    if want is None:
        if mode == "none":
            return []
        return [f"{name}: mla_graph.json records no digest of it (export.files): its content cannot be checked "
                f"(export again, or load it unchecked with {OVERRIDE})"]
    size = path.stat().st_size
    if size != want["size"]:
        return [f"{name}: {size} bytes, the export wrote {want['size']}: it was changed or truncated after the "
                "export (export again)"]
    if mode == "sampled" and digest(path) != want["digest"]:
        return [f"{name}: differs from the file the export wrote (sampled digest mismatch): the export's files "
                "do not belong together (export again)"]
    if mode == "full":
        if "full_digest" not in want:
            return [f"{name}: mla_graph.json records only a sampled digest of it (an export made before full "
                    "digests): a full check is not possible (export again, or use --verify sampled)"]
        recorded_alg = str(want["full_digest"]).partition(":")[0]
        if recorded_alg != FULL_DIGEST_ALGORITHM:
            return [f"{name}: its full digest was recorded with {recorded_alg!r}, this mla-export computes "
                    f"{FULL_DIGEST_ALGORITHM!r} (export again, or use --verify sampled)"]
        if full_digest(path, threads) != want["full_digest"]:
            return [f"{name}: differs from the file the export wrote (full {FULL_DIGEST_ALGORITHM} digest "
                    "mismatch): a byte changed after the export (export again)"]
    return []


def verify_files(out_dir: str | Path, recorded, listed, mode: str = "full", threads: int | None = None) -> list[str]:
    """Every mismatch of the listed files against `recorded` (export.files), one message each,
    checking all files (the `verify` command's report). mode: sampled | full | none."""
    out_dir = Path(out_dir)
    if recorded is None:
        recorded = {}
    if not isinstance(recorded, dict):
        raise _error(f"{out_dir}: mla_graph.json: export.files must be an object, got {type(recorded).__name__}")
    problems = []
    for name in sorted(set(listed)):
        problems += _problems(out_dir, name, recorded.get(name), mode, threads)
    return problems


def check_files(out_dir: str | Path, recorded, listed, mode: str | None = None) -> None:
    """Raise ContractError at the first listed file that is missing, unrecorded (unless mode is
    "none") or differs from its record."""
    mode = verify_mode(mode)
    out_dir = Path(out_dir)
    if not recorded and mode != "none":
        raise _error(f"{out_dir}: mla_graph.json records no digests of the export's files (export.files is "
                     f"missing or empty): the files cannot be checked (export again, or load it unchecked "
                     f"with {OVERRIDE})")
    for name in sorted(set(listed)):
        problems = _problems(out_dir, name, (recorded or {}).get(name), mode, None)
        if problems:
            raise _error(f"{out_dir}: {problems[0]}")


def _error(message: str):
    from .contract_error import ContractError

    return ContractError(message)
