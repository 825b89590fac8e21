"""A document as read from an input: its id, text, metadata, and where it came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import place


@dataclass(frozen=True)
class Document:
    external_id: str
    text: str
    metadata: dict = field(default_factory=dict)
    path: str | None = None
    line: int | None = None  # a Row for a Parquet file

    @property
    def origin(self) -> str:
        if self.path is None:
            return f"document {self.external_id!r}"
        return place(self.path, self.line)
