"""What an open index knows, in one object handed to the PostgreSQL layer so that it re-reads none of it.

sqlite-utils' ``Table`` carries its database and its name; an :class:`IndexContext` carries where an
index lives (``engine``, ``schema``), its stored settings as read and checked on open, and what follows
from them: the method, the method's SQL (:func:`simdb.pg.methods.sql_of`), and whether the index is
distributed on a Citus cluster, which its settings say. The PostgreSQL layer's functions take the context,
or the one fact they need from it (``distributed=``); none asks the database again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa

from ..methods import Method
from ..settings import IndexSettings
from .keyed import KEYED, layout_of
from .methods import MethodSQL, sql_of


@dataclass(frozen=True)
class IndexContext:
    """An open index: where it lives, its settings, its method and that method's SQL, distributed or not."""

    engine: sa.Engine
    schema: str
    settings: IndexSettings

    @property
    def method(self) -> Method:
        return self.settings.method

    @property
    def distributed(self) -> bool:
        """Whether the index is distributed (``simdb init --distributed``): its settings say so."""
        return self.settings.distributed is not None

    @property
    def keyed(self) -> bool:
        """Whether the index has the keyed distributed layout (``--distributed-layout keyed``, :mod:`simdb.pg.keyed`)."""
        return layout_of(self.settings.distributed) == KEYED

    @functools.cached_property
    def sql(self) -> MethodSQL:
        return sql_of(self.settings.method)
