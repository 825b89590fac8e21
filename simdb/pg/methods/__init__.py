"""Each method's SQL (:class:`MethodSQL`), registered by the method's name: :func:`sql_of` gives an index's.

* :mod:`.base`: the interface, and what every method's analysts' functions share;
* :mod:`.simhash`: block keys computed in SQL, equality joins on them, popcount in numpy;
* :mod:`.minhash`: band keys (``md5()``), joins on them, signatures compared in numpy.
"""

from .base import MethodSQL, sql_of
from .minhash import MinHashSQL
from .simhash import SimHashSQL

__all__ = ["MethodSQL", "MinHashSQL", "SimHashSQL", "sql_of"]
