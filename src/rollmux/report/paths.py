"""Checking, before a run starts, that the places its report goes can be written; and
writing reports there whole or not at all (a temporary file beside the target, renamed
over it once complete: a full disk leaves the previous file as it was, never half a
new one)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from rollmux.errors import OutputPathError


def check_writable(path: Path, option: str, directory: bool = False) -> None:
    """Raise OutputPathError (naming ``option``) unless ``path`` can be written.

    ``directory=True``: ``path`` is a folder (made if missing) that files go into;
    otherwise a file (its missing parent folders made). Either must be an existing,
    writable thing of that kind, or creatable in its nearest existing ancestor, which
    must be a writable folder. A file path may also be a link (the file it leads to is
    checked) or an existing device or pipe (``/dev/null``, written in place: see
    ``replacing``). Nothing is created here.
    """
    kind = "folder" if directory else "file"
    if not directory and _special(path):
        if not os.access(path, os.W_OK):
            raise OutputPathError(option, path, "the file is not writable")
        return
    if not directory and path.is_symlink():
        path = path.resolve()
    if path.exists():
        if directory and not path.is_dir():
            raise OutputPathError(option, path, "exists and is not a folder")
        if not directory and path.is_dir():
            raise OutputPathError(option, path, "is a folder; expected a file path")
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)):
            raise OutputPathError(option, path, f"the {kind} is not writable")
        _probe(path if directory else path.parent, option, path, f"the {kind} is not writable")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(option, path, f"cannot make the {kind}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(option, path, f"cannot make the {kind}: {ancestor} is not writable")
    _probe(ancestor, option, path, f"cannot make the {kind} in {ancestor}")


def _probe(folder: Path, option: str, path: Path, what: str) -> None:
    """Create (and at once drop) a nameless file in ``folder``: ``os.access`` says yes to
    root everywhere, /proc included, where the write then failed after the whole run."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise OutputPathError(option, path, f"{what} ({err.strerror or err})") from None


def check_outputs(paths: dict[str, Path | None], suffixes: dict[str, tuple[str, ...]] | None = None,
                  inputs: dict[str, str | Path | None] | None = None) -> None:
    """``check_writable`` for each option's path given, and more: no two options given
    the same file (the later write replaced the earlier one), no output that is one of
    the run's ``inputs`` (option -> the path it read, or a name that is not a file: a
    builtin trace), which the report would replace, and a path of an option in
    ``suffixes`` ending in one of its suffixes (``--plot``: ``.png``). A device
    (``/dev/null``) may take several outputs."""
    seen: dict[Path, str] = {}
    read = {option: Path(p) for option, p in (inputs or {}).items() if p is not None and Path(p).is_file()}
    for option, path in paths.items():
        if path is None:
            continue
        check_writable(path, option)
        allowed = (suffixes or {}).get(option)
        if allowed and path.suffix.lower() not in allowed:
            raise OutputPathError(option, path, f"expected a file name ending in {' or '.join(allowed)}")
        for source, given in read.items():
            if path.exists() and os.path.samefile(path, given):
                raise OutputPathError(option, path, f"is the file {source} reads; the report would replace it")
        if _special(path):
            continue
        key = path.resolve()
        if key in seen:
            raise OutputPathError(option, path, f"the same file as {seen[key]}; give each output its own file")
        seen[key] = option


def _special(path: Path) -> bool:
    """Whether ``path`` (links followed) is an existing file that is neither a regular
    file nor a folder: a device such as ``/dev/null``, a named pipe, a socket."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextlib.contextmanager
def replacing(path: Path, option: str | None = None) -> Iterator[Path]:
    """A temporary path beside ``path`` for the body to write; renamed over ``path`` when
    the body returns, removed when it raises, so ``path`` is then untouched. An OS error
    (a full disk, a folder that cannot be made) raises OutputPathError naming ``option``
    (the OSError itself without one). A link is followed: the file it leads to is
    replaced and the link kept. A device or a pipe (``/dev/null``) is written in place,
    as ``open`` would: renamed over, it became a plain file (as root, for every process
    on the machine)."""
    path = Path(path)
    special = _special(path)
    if not special and path.is_symlink():
        path = path.resolve()
    tmp = None
    try:
        if special:
            yield path
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and option is not None:
            raise OutputPathError(option, path, str(err.strerror or err)) from None
        raise


def write_text(path: Path, text: str, option: str) -> Path:
    """``text`` (UTF-8) at ``path``, whole or not at all (``replacing``)."""
    return written_by(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), option)


def written_by(path: Path, write: Callable[[Path], object], option: str | None = None) -> Path:
    """``write(tmp)`` into a temporary file, then renamed to ``path`` (``replacing``)."""
    with replacing(path, option) as tmp:
        write(tmp)
    return path


def _file_mode() -> int:
    """What a new file gets under this process's umask (read once, at import)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()


def json_text(payload) -> str:
    """``payload`` as indented, standard JSON: every float that is not finite (an infinite
    slowdown, ``--accounting paper``'s unlimited host memory, NaN) becomes ``null``, in
    dicts, lists and tuples at any depth. Dumped with ``allow_nan=False``: a non-finite
    value this missed raises ValueError rather than be written as ``Infinity``, which
    JSON parsers refuse."""
    return json.dumps(_finite(payload), indent=1, allow_nan=False)


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, payload, option: str = "--json") -> None:
    """Write ``payload`` as ``json_text`` at ``path``, making its folder, whole or not at
    all; an OS error raises OutputPathError naming ``option``."""
    write_text(path, json_text(payload), option)


def csv_cell(value):
    """``value`` for a CSV cell a spreadsheet will open: text starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return (a formula to Excel or LibreOffice: a job id
    ``=HYPERLINK(...)``) gets a leading ``'``; numbers and other text as they are."""
    if isinstance(value, str) and value[:1] in _FORMULA_START:
        return "'" + value
    return value


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
