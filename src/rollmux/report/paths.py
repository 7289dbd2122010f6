"""Checking, before a run starts, that the places its report goes can be written; and
writing a JSON report there."""
from __future__ import annotations

import json
import os
from pathlib import Path

from rollmux.errors import OutputPathError


def check_writable(path: Path, option: str, directory: bool = False) -> None:
    """Raise OutputPathError (naming ``option``) unless ``path`` can be written.

    ``directory=True``: ``path`` is a folder (made if missing) that files go into;
    otherwise a file (its missing parent folders made). Either must be an existing,
    writable thing of that kind, or creatable in its nearest existing ancestor, which
    must be a writable folder. Nothing is created here.
    """
    kind = "folder" if directory else "file"
    if path.exists():
        if directory and not path.is_dir():
            raise OutputPathError(option, path, "exists and is not a folder")
        if not directory and path.is_dir():
            raise OutputPathError(option, path, "is a folder; expected a file path")
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)):
            raise OutputPathError(option, path, f"the {kind} is not writable")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(option, path, f"cannot make the {kind}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(option, path, f"cannot make the {kind}: {ancestor} is not writable")


def write_json(path: Path, payload, option: str = "--json") -> None:
    """Write ``payload`` as indented JSON at ``path``, making its folder; an OS error
    raises OutputPathError naming ``option``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1))
    except OSError as err:
        raise OutputPathError(option, path, str(err.strerror or err)) from None
