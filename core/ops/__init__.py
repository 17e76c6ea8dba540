"""Op registry: attributes, shape inference and numpy reference per op.

Importing this package registers every builtin op litegpu knows.
"""
from . import control, elementwise, nn, reduce, shape  # noqa: F401  (each registers its ops)
from . import quantized, quantized_act, quantized_math, hybrid  # noqa: F401,E402  (after them: add integer/hybrid references)
from . import hybrid_lstm  # noqa: F401,E402  (after hybrid: the hybrid LSTM references)
from . import integer_lstm  # noqa: F401,E402  (after quantized: the full-integer LSTM references)
from . import composite  # noqa: F401,E402  (litert-torch's composites as fused ops)
from .registry import (DynamicShape, OpDef, TensorSpec, all_ops, apply_activation, broadcast_shapes,
                       check_inputs, const_input, defop, get_op, normalize_axis, register, value_of, VIEW_OPS)

__all__ = [
    "DynamicShape", "OpDef", "TensorSpec", "all_ops", "apply_activation", "broadcast_shapes",
    "check_inputs", "const_input", "defop", "get_op", "normalize_axis", "register", "value_of", "VIEW_OPS",
]
