"""An export is a directory: nothing its files name may resolve outside it.

`mla_graph.json` names the graph, weights and tokenizer files (and may name a chat template
file). A name like `../../etc/passwd`, an absolute path, or a symlink inside the directory that
points elsewhere would make a loader read (or an OVMS layout copy) a file the export does not
own. `inside(out_dir, name, what)` returns the path when it stays inside, else raises
ContractError naming the entry."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

__all__ = ["inside"]


def inside(out_dir: str | Path, name: str, what: str) -> Path:
    from .contract_error import ContractError

    if not isinstance(name, str) or not name:
        raise ContractError(f"mla_graph.json: {what} must be a file name, got {str(name)[:60]!r}")
    pure = PurePosixPath(name)
    # "." has no parts at all (it names the directory itself); a NUL byte or an over-long name would
    # end in the OS's error, not ours
    if (not pure.parts or pure.is_absolute() or "\\" in name or "\0" in name or len(name) > 255
            or any(part in ("..", "") for part in pure.parts) or ":" in pure.parts[0]):
        raise ContractError(f"mla_graph.json: {what} {name[:60]!r} must be a plain name inside the export directory")
    root = Path(out_dir).resolve()
    path = (root / name).resolve()
    if path != root and root not in path.parents:
        raise ContractError(f"mla_graph.json: {what} {name!r} resolves to {path}, outside the export directory "
                            f"{root} (a symlink out of it?)")
    return path
