"""cpu kernels; importing this package registers them."""
from .registry import KERNELS, bindable, kernel, make_kernel, reference_kernel  # noqa: F401
from . import threads  # noqa: F401,E402
from .. import numba_cache  # noqa: E402
# Before any kernel module defines a cache=True function: numba places each one's cache
# when its decorator runs, and ours belong under litegpu's cache root, not the package.
numba_cache.install()
# Each registers its kernels.
from . import conv, depthwise, elementwise, indexing, layout, misc, pool  # noqa: F401,E402
from . import qconv, qd8conv, qelementwise, qpool, qreduce  # noqa: F401,E402
from . import q16  # noqa: F401,E402  (after the 8-bit ones: their factories decline int16 nodes)
from . import qmatmul, qnorm, qtransposeconv  # noqa: F401,E402
from . import q16transposeconv  # noqa: F401,E402
from . import qd8transposeconv  # noqa: F401,E402
