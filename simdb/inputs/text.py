"""Text files -> one document each, whose id is the path as given."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from ..errors import InputError
from . import checks
from .lines import read_whole
from .model import Document


def read_txt(path: str, progress: Callable[[int], None] | None = None) -> Iterator[Document]:
    external_id = checks.external_id(path, "path", path, None)
    with checks.about(external_id):  # whatever is wrong with the file, a reject keeps its path as its id
        raw = read_whole(path)
        if progress is not None:
            progress(os.path.getsize(path))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise InputError(f"invalid UTF-8 (byte {raw[exc.start]:#04x})", path=path, line=line,
                             hint="re-encode the file as UTF-8") from None
        if "\x00" in text:
            line = text.count("\n", 0, text.index("\x00")) + 1
            raise InputError("the text contains a NUL character, which PostgreSQL cannot store",
                             path=path, line=line, hint="remove NUL bytes from the input")
        document = Document(external_id, checks.check_text(text, path, None), {}, path, None)
    yield document
