"""simdb's version, in a module of its own: the modules that record it (:mod:`simdb.settings`, the server's
functions) read it here, not from the package's ``__init__``, which imports them."""

__version__ = "0.1.0"
