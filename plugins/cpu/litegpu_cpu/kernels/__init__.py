"""cpu kernels; importing this package registers them."""
from .registry import KERNELS, bindable, kernel, make_kernel, reference_kernel  # noqa: F401
from . import threads  # noqa: F401,E402
# Each registers its kernels. Their numba functions are made when numba is first needed
# (see ..jit): a warm process links its task functions without numba.
from . import conv, depthwise, elementwise, indexing, layout, misc, pool  # noqa: F401,E402
from . import composite  # noqa: F401,E402  (after misc: it runs the cpu SOFTMAX's row)
from . import attention  # noqa: F401,E402  (after misc: likewise)
from . import qconv, qd8conv, qelementwise, qpool, qreduce, qb4w  # noqa: F401,E402
from . import q16  # noqa: F401,E402  (after the 8-bit ones: their factories decline int16 nodes)
from . import qmatmul, qnorm, qtransposeconv  # noqa: F401,E402
from . import q16transposeconv  # noqa: F401,E402
from . import qd8transposeconv  # noqa: F401,E402
from .. import jit  # noqa: E402
jit.materialize_if_imported()
