"""The methods: each a way of turning texts into sketches and finding near-duplicate sketches.

:class:`Method` is the interface the rest of simdb uses; :class:`SimHash` and :class:`MinHash`
register themselves under their names when this package is imported.
"""

from .base import DEFAULT_SEED, Method
from .minhash import MinHash
from .simhash import SimHash

__all__ = ["DEFAULT_SEED", "Method", "MinHash", "SimHash"]
