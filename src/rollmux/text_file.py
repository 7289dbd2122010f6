"""A user's text file (trace, profiles, cluster, fleet, tenants, job spec), read whole.

``read_text(path)`` decodes UTF-8 (a leading byte-order mark is dropped). Bytes that are
not UTF-8 (a file saved as Latin-1, a binary file) raise ``TraceFormatError`` naming the
file, the line, the byte and the character it is in its line (counted as the trace
reader counts them: characters, not bytes; a line ends at LF, CR LF or a lone CR), where
Python's own ``UnicodeDecodeError`` named neither file nor line and, uncaught, ended a
command with a traceback. ``csv_fields(text, path, line)``
splits one CSV line; what the ``csv`` module refuses (a field over its size limit, a
quoted cell left open or with text after its closing quote) is a ``TraceFormatError``
naming the line too.
"""
from __future__ import annotations

import codecs
import csv
import io
from pathlib import Path

from rollmux.errors import TraceFormatError


def read_text(path: str | Path) -> str:
    """The file's text (see the module docstring); ``OSError`` as ``open`` raises it."""
    data = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        # the text before the bad byte decodes; "x" stands for the byte, so the last line is the one holding it
        lines = io.StringIO(data[:err.start].decode("utf-8") + "x", newline="").readlines()
        line, column = len(lines), len(lines[-1])
        raise TraceFormatError(str(path), line, "", f"not UTF-8 text: byte 0x{data[err.start]:02x} at character "
                                                    f"{column} (save the file as UTF-8)") from None


def csv_fields(text: str, path: str | Path, line: int) -> list[str]:
    """The fields of one CSV line of ``path`` (see the module docstring). Quoting is
    strict: a quoted cell must close on its line (a cell cannot hold a line break: the
    files are read line by line, and no id or name may hold one) and be followed by a
    comma or the end of the line."""
    try:
        return next(csv.reader([text], strict=True), [])
    except csv.Error as err:
        if str(err) == "unexpected end of data":
            raise TraceFormatError(str(path), line, "", "a quoted cell does not close on this line (a cell "
                                   "cannot hold a line break)") from None
        raise TraceFormatError(str(path), line, "", f"not a CSV row ({err})") from None
