"""One exporter per output path, and what a killed one left behind cleaned up.

- `OutputLock(out_dir)`: an exclusive `flock` on `.NAME.lock` beside OUT_DIR, held for the whole
  export. A second export to the same path fails at once (naming the holder's pid) instead of
  replacing the first one's output. The lock file is removed on release, safely: a locker checks
  after `flock` that the path still names the file it locked (else it locks again), so a file
  unlinked by the previous holder is never a second lock. The kernel drops the lock when its
  holder dies, even by SIGKILL.
- Owner records: every `.NAME.partial-*` directory (and the old export renamed aside while it is
  replaced, `.NAME.old-*`) has a sibling `<dir>.owner` file holding the exporter's pid, the boot
  id and the process's start time, written before the directory exists.
- `clean_stale(out_dir)` (run holding the lock): every partial/old directory whose owner is dead
  is removed (an old export is put back instead when OUT_DIR itself is missing: the kill landed
  between the two renames). Dead means: the record's (boot id, pid, start time) is not a running
  process of this machine. The lock is the first guarantee (a live exporter holds it, so under the
  lock every sibling is a dead one's); the owner record is the second (a filesystem where flock
  is a no-op, a live exporter's partial is still kept). A directory without a readable record
  (an older mla-export's) is left alone."""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import shutil
import socket
from pathlib import Path

__all__ = ["OutputLock", "OutputBusy", "clean_stale", "write_owner", "remove_owner", "owner_path"]

OWNER_SUFFIX = ".owner"


class OutputBusy(RuntimeError):
    """Another live exporter holds the output path's lock."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def owner_record() -> dict:
    return {"pid": os.getpid(), "boot_id": _boot_id(), "start_time": _start_time(os.getpid()),
            "host": socket.gethostname()}


def owner_path(directory: Path) -> Path:
    return directory.with_name(directory.name + OWNER_SUFFIX)


def write_owner(directory: Path) -> None:
    """Record this process as the owner of `directory` (before it is created or renamed into being)."""
    path = owner_path(directory)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(owner_record()) + "\n")
    os.replace(tmp, path)


def remove_owner(directory: Path) -> None:
    try:
        owner_path(directory).unlink()
    except FileNotFoundError:
        pass


def _alive(owner: dict) -> bool:
    """True unless the record is surely of a dead process of this machine."""
    if owner.get("boot_id") != _boot_id() or owner.get("host") != socket.gethostname():
        # Another boot of this machine: dead. Another host (a shared filesystem): its exporter
        # holds the lock if alive, and we hold it now, so it is dead too.
        return False
    pid = owner.get("pid")
    return isinstance(pid, int) and pid > 0 and _start_time(pid) is not None and _start_time(pid) == owner.get("start_time")


def _read_owner(path: Path) -> dict | None:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def clean_stale(out_dir: Path) -> list[str]:
    """Remove the partial / old directories of dead exporters beside out_dir (call it holding the
    OutputLock). Returns one description per directory removed or restored."""
    done = []
    parent, name = out_dir.parent, glob.escape(out_dir.name)  # a name like "out[1]" is no pattern
    for kind in ("partial", "old"):
        for path in sorted(parent.glob(f".{name}.{kind}-*")):
            if not path.is_dir() or path.is_symlink():  # (owner records match the pattern too)
                continue
            owner = _read_owner(owner_path(path))
            if owner is None or _alive(owner):
                continue  # not ours to judge, or a live exporter's
            if kind == "old" and not out_dir.exists():
                path.rename(out_dir)  # killed between the two renames: the old export goes back
                done.append(f"restored {out_dir} from {path.name} (its exporter, pid {owner.get('pid')}, was killed "
                            "while replacing it)")
            else:
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed {path.name} (left by exporter pid {owner.get('pid')}, no longer running)")
            remove_owner(path)
    for path in parent.glob(f".{name}.*{OWNER_SUFFIX}"):  # records whose directory is gone
        directory = path.with_name(path.name[:-len(OWNER_SUFFIX)])
        owner = _read_owner(path)
        if not directory.exists() and owner is not None and not _alive(owner):
            path.unlink(missing_ok=True)
    for path in parent.glob(f".{name}.*{OWNER_SUFFIX}.*"):  # a record half written (write_owner's temporary)
        pid = path.name.rpartition(".")[2]
        if pid.isdigit() and _start_time(int(pid)) is None:
            path.unlink(missing_ok=True)
    return done


class OutputLock:
    """`with OutputLock(out_dir):` holds `.NAME.lock` beside out_dir (OutputBusy if taken)."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.path = out_dir.parent / f".{out_dir.name}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise OutputBusy(f"another `mla-export export`{who} is writing {self.out_dir} "
                                 "now; wait for it to finish or choose another -o") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the previous holder removed the file between our open and flock: again
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # still holding the lock: no one else has it
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None
