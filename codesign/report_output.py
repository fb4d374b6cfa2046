"""Where a command's output files go: checked before any work, and written all-or-nothing.

:func:`check_output` is the start-up check of an output directory (``output=DIR`` of ``codesign.report`` and
``codesign.compare``): the directory is, or can be created as, a writable directory, and none of the files (or
sub-directories) the command will write is in the way as something else (a directory where a file goes, a file where
a directory goes). A problem is one :class:`ConfigError` line naming the field and the path.

:func:`write_files` writes a command's files together: every file is first written into a temporary directory next
to its destination (a sibling of ``DIR`` when ``DIR`` does not exist yet, which is then renamed into place whole;
else a hidden directory inside ``DIR``), and only once all of them are complete are they moved into place with
``os.replace``. A failure while writing leaves nothing behind: the temporary directory is removed and the previous
files, if any, are untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from arch_space.errors import ConfigError


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_output(out, files: Iterable[str] = (), dirs: Iterable[str] = (), field: str = "output") -> Path:
    """Check that ``files`` (relative paths) can be written under the directory ``out``; return ``out`` as a Path.

    ``dirs`` are sub-directories the command needs (their absence is fine). Nothing is created."""
    p = Path(str(out)).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(field, f"{str(p)!r} is an existing file, not a directory")
    if p.is_symlink() and not p.exists():
        raise ConfigError(field, f"{str(p)!r} is a broken symbolic link")
    anc = p if p.exists() else next((a for a in p.absolute().parents if a.exists()), None)
    if anc is None or not anc.is_dir():
        raise ConfigError(field, f"cannot create the directory {str(p)!r}: {str(anc)!r} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(field, f"cannot write under {str(p)!r}: {str(anc)!r} is not writable")
    rels = [Path(r) for r in files]
    for d in [*(Path(d) for d in dirs), *{r.parent for r in rels if r.parent != Path(".")}]:
        q = p / d
        if q.exists() and not q.is_dir():
            raise ConfigError(field, f"{str(q)!r} is an existing file, but the output needs a directory there")
    for r in rels:
        q = p / r
        if q.is_dir():
            raise ConfigError(field, f"{str(q)!r} is a directory, but the output writes the file {r.as_posix()} "
                                     f"there")
        if q.exists() and not q.is_file():
            raise ConfigError(field, f"{str(q)!r} exists and is not a regular file")
    return p


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_files(out, writers: dict[str, bytes | Callable[[Path], None]], field: str = "output") -> dict[str, Path]:
    """Write every entry of ``writers`` (relative path -> bytes, or a function writing the file at the path it is
    given) under the directory ``out``, all-or-nothing (see the module docstring); they are moved into place in the
    order given. Returns relative path -> final path. A problem with the location is a ConfigError on ``field``."""
    out = check_output(out, writers, field=field)
    fresh = not out.exists()
    try:
        if fresh:
            out.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
            os.chmod(stage, 0o777 & ~_umask())  # the directory it becomes gets the usual permissions
        else:
            stage = Path(tempfile.mkdtemp(dir=out, prefix=".partial.", suffix=".tmp"))
    except OSError as exc:
        raise ConfigError(field, f"cannot write under {str(out)!r}: {_why(exc)}") from None
    done = {rel: out / rel for rel in writers}
    dest = out
    try:
        for rel, write in writers.items():
            dest, tmp = out / rel, stage / rel
            tmp.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(write, (bytes, bytearray)):
                tmp.write_bytes(write)
            else:
                write(tmp)
        if fresh:
            dest = out
            os.rename(stage, out)  # the whole directory at once
            return done
        for rel in writers:
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, dest)
        return done
    except OSError as exc:
        raise ConfigError(field, f"cannot write {str(dest)!r}: {_why(exc)}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


__all__ = ["check_output", "write_files"]
