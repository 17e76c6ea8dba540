"""cpu kernels; importing this package registers them."""
from .registry import KERNELS, kernel, make_kernel, reference_kernel  # noqa: F401
