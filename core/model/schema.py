"""The parts of LiteRT's ``schema.fbs`` that litegpu reads and writes, as data.

A flatbuffer table field is addressed by its slot (its position in the table's
declaration); the reader and the test-model builder both take field layouts from
here, so the schema is written down once.

Field types: ``bool byte ubyte int uint long ulong float`` (scalars), ``string``,
``[int]`` / ``[float]`` / ``[long]`` / ``[ubyte]`` (vectors of scalars).
"""
from __future__ import annotations

import numpy as np

FILE_IDENTIFIER = b"TFL3"

# TensorType enum -> numpy dtype (None: no numpy equivalent we execute).
TENSOR_TYPES: dict[int, tuple[str, np.dtype | None]] = {
    0: ("FLOAT32", np.dtype(np.float32)),
    1: ("FLOAT16", np.dtype(np.float16)),
    2: ("INT32", np.dtype(np.int32)),
    3: ("UINT8", np.dtype(np.uint8)),
    4: ("INT64", np.dtype(np.int64)),
    5: ("STRING", None),
    6: ("BOOL", np.dtype(np.bool_)),
    7: ("INT16", np.dtype(np.int16)),
    8: ("COMPLEX64", np.dtype(np.complex64)),
    9: ("INT8", np.dtype(np.int8)),
    10: ("FLOAT64", np.dtype(np.float64)),
    11: ("COMPLEX128", np.dtype(np.complex128)),
    12: ("UINT64", np.dtype(np.uint64)),
    13: ("RESOURCE", None),
    14: ("VARIANT", None),
    15: ("UINT32", np.dtype(np.uint32)),
    16: ("UINT16", np.dtype(np.uint16)),
    17: ("INT4", np.dtype(np.int8)),         # two a byte in the file; unpacked to int8 at load
    18: ("BFLOAT16", None),
    19: ("INT2", None),
    20: ("UINT4", None),
    21: ("FLOAT8_E4M3FN", None),
    22: ("FLOAT8_E5M2", None),
}
DTYPE_TO_TENSOR_TYPE = {dt: code for code, (name, dt) in TENSOR_TYPES.items() if dt is not None and name != "INT4"}

# QuantizationParameters: min, max, scale, zero_point, details_type, details, quantized_dimension.
# ``details`` is the QuantizationDetails union (type = position + 1); each member as (table name,
# fields in slot order). litegpu reads BlockwiseQuantization: ``scales`` names the tensor holding one
# scale per block of ``block_size`` values along the last axis, per output channel.
QUANTIZATION_DETAILS: list[tuple[str, list[tuple[str, str, object]]]] = [
    ("CustomQuantization", [("custom", "[ubyte]", None)]),
    ("BlockwiseQuantization", [("scales", "int", 0), ("zero_points", "int", 0), ("block_size", "int", 0),
                               ("block_shape", "[int]", None)]),
]

BUILTIN_OPERATORS = """
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D DEPTH_TO_SPACE DEQUANTIZE
EMBEDDING_LOOKUP FLOOR FULLY_CONNECTED HASHTABLE_LOOKUP L2_NORMALIZATION L2_POOL_2D
LOCAL_RESPONSE_NORMALIZATION LOGISTIC LSH_PROJECTION LSTM MAX_POOL_2D MUL RELU RELU_N1_TO_1
RELU6 RESHAPE RESIZE_BILINEAR RNN SOFTMAX SPACE_TO_DEPTH SVDF TANH CONCAT_EMBEDDINGS SKIP_GRAM
CALL CUSTOM EMBEDDING_LOOKUP_SPARSE PAD UNIDIRECTIONAL_SEQUENCE_RNN GATHER BATCH_TO_SPACE_ND
SPACE_TO_BATCH_ND TRANSPOSE MEAN SUB DIV SQUEEZE UNIDIRECTIONAL_SEQUENCE_LSTM STRIDED_SLICE
BIDIRECTIONAL_SEQUENCE_RNN EXP TOPK_V2 SPLIT LOG_SOFTMAX DELEGATE BIDIRECTIONAL_SEQUENCE_LSTM
CAST PRELU MAXIMUM ARG_MAX MINIMUM LESS NEG PADV2 GREATER GREATER_EQUAL LESS_EQUAL SELECT SLICE
SIN TRANSPOSE_CONV SPARSE_TO_DENSE TILE EXPAND_DIMS EQUAL NOT_EQUAL LOG SUM SQRT RSQRT SHAPE POW
ARG_MIN FAKE_QUANT REDUCE_PROD REDUCE_MAX PACK LOGICAL_OR ONE_HOT LOGICAL_AND LOGICAL_NOT UNPACK
REDUCE_MIN FLOOR_DIV REDUCE_ANY SQUARE ZEROS_LIKE FILL FLOOR_MOD RANGE RESIZE_NEAREST_NEIGHBOR
LEAKY_RELU SQUARED_DIFFERENCE MIRROR_PAD ABS SPLIT_V UNIQUE CEIL REVERSE_V2 ADD_N GATHER_ND COS
WHERE RANK ELU REVERSE_SEQUENCE MATRIX_DIAG QUANTIZE MATRIX_SET_DIAG ROUND HARD_SWISH IF WHILE
NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5 SCATTER_ND SELECT_V2 DENSIFY SEGMENT_SUM
BATCH_MATMUL PLACEHOLDER_FOR_GREATER_OP_CODES CUMSUM CALL_ONCE BROADCAST_TO RFFT2D CONV_3D IMAG
REAL COMPLEX_ABS HASHTABLE HASHTABLE_FIND HASHTABLE_IMPORT HASHTABLE_SIZE REDUCE_ALL
CONV_3D_TRANSPOSE VAR_HANDLE READ_VARIABLE ASSIGN_VARIABLE BROADCAST_ARGS RANDOM_STANDARD_NORMAL
BUCKETIZE RANDOM_UNIFORM MULTINOMIAL GELU DYNAMIC_UPDATE_SLICE RELU_0_TO_1 UNSORTED_SEGMENT_PROD
UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_SUM ATAN2 UNSORTED_SEGMENT_MIN SIGN BITCAST BITWISE_XOR
RIGHT_SHIFT STABLEHLO_LOGISTIC STABLEHLO_ADD STABLEHLO_DIVIDE STABLEHLO_MULTIPLY STABLEHLO_MAXIMUM
STABLEHLO_RESHAPE STABLEHLO_CLAMP STABLEHLO_CONCATENATE STABLEHLO_BROADCAST_IN_DIM STABLEHLO_CONVOLUTION
STABLEHLO_SLICE STABLEHLO_CUSTOM_CALL STABLEHLO_REDUCE STABLEHLO_ABS STABLEHLO_AND STABLEHLO_COSINE
STABLEHLO_EXPONENTIAL STABLEHLO_FLOOR STABLEHLO_LOG STABLEHLO_MINIMUM STABLEHLO_NEGATE STABLEHLO_OR
STABLEHLO_POWER STABLEHLO_REMAINDER STABLEHLO_RSQRT STABLEHLO_SELECT STABLEHLO_SUBTRACT STABLEHLO_TANH
STABLEHLO_SCATTER STABLEHLO_COMPARE STABLEHLO_CONVERT STABLEHLO_DYNAMIC_SLICE STABLEHLO_DYNAMIC_UPDATE_SLICE
STABLEHLO_PAD STABLEHLO_IOTA STABLEHLO_DOT_GENERAL STABLEHLO_REDUCE_WINDOW STABLEHLO_SORT STABLEHLO_WHILE
STABLEHLO_GATHER STABLEHLO_TRANSPOSE DILATE STABLEHLO_RNG_BIT_GENERATOR REDUCE_WINDOW STABLEHLO_COMPOSITE
STABLEHLO_SHIFT_LEFT STABLEHLO_CBRT STABLEHLO_CASE
""".split()
BUILTIN_CODES = {name: code for code, name in enumerate(BUILTIN_OPERATORS)}
CUSTOM_CODE = BUILTIN_CODES["CUSTOM"]


def builtin_name(code: int) -> str:
    """The name of a BuiltinOperator code (``BUILTIN_<n>`` for codes this schema predates)."""
    if 0 <= code < len(BUILTIN_OPERATORS):
        return BUILTIN_OPERATORS[code]
    return f"BUILTIN_{code}"


PADDING = {0: "SAME", 1: "VALID"}
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
MIRROR_PAD_MODES = {0: "REFLECT", 1: "SYMMETRIC"}

_ACT = ("fused_activation_function", "byte", 0)

# BuiltinOptions union members, in union order (union type = position + 1).
# Each: (table name, fields as (name, type, default) in slot order).
BUILTIN_OPTIONS: list[tuple[str, list[tuple[str, str, object]]]] = [
    ("Conv2DOptions", [("padding", "byte", 0), ("stride_w", "int", 0), ("stride_h", "int", 0), _ACT,
                       ("dilation_w_factor", "int", 1), ("dilation_h_factor", "int", 1),
                       ("quantized_bias_type", "byte", 0)]),
    ("DepthwiseConv2DOptions", [("padding", "byte", 0), ("stride_w", "int", 0), ("stride_h", "int", 0),
                                ("depth_multiplier", "int", 0), _ACT,
                                ("dilation_w_factor", "int", 1), ("dilation_h_factor", "int", 1)]),
    ("ConcatEmbeddingsOptions", [("num_channels", "int", 0), ("num_columns_per_channel", "[int]", None),
                                 ("embedding_dim_per_channel", "[int]", None)]),
    ("LSHProjectionOptions", [("type", "byte", 0)]),
    ("Pool2DOptions", [("padding", "byte", 0), ("stride_w", "int", 0), ("stride_h", "int", 0),
                       ("filter_width", "int", 0), ("filter_height", "int", 0), _ACT]),
    ("SVDFOptions", [("rank", "int", 0), _ACT, ("asymmetric_quantize_inputs", "bool", False)]),
    ("RNNOptions", [_ACT, ("asymmetric_quantize_inputs", "bool", False)]),
    ("FullyConnectedOptions", [_ACT, ("weights_format", "byte", 0), ("keep_num_dims", "bool", False),
                               ("asymmetric_quantize_inputs", "bool", False),
                               ("quantized_bias_type", "byte", 0)]),
    ("SoftmaxOptions", [("beta", "float", 0.0)]),
    ("ConcatenationOptions", [("axis", "int", 0), _ACT]),
    ("AddOptions", [_ACT, ("pot_scale_int16", "bool", True)]),
    ("L2NormOptions", [_ACT]),
    ("LocalResponseNormalizationOptions", [("radius", "int", 0), ("bias", "float", 0.0),
                                           ("alpha", "float", 0.0), ("beta", "float", 0.0)]),
    ("LSTMOptions", [_ACT, ("cell_clip", "float", 0.0), ("proj_clip", "float", 0.0),
                     ("kernel_type", "byte", 0), ("asymmetric_quantize_inputs", "bool", False)]),
    ("ResizeBilinearOptions", [("new_height", "int", 0), ("new_width", "int", 0),
                               ("align_corners", "bool", False), ("half_pixel_centers", "bool", False)]),
    ("CallOptions", [("subgraph", "uint", 0)]),
    ("ReshapeOptions", [("new_shape", "[int]", None)]),
    ("SkipGramOptions", [("ngram_size", "int", 0), ("max_skip_size", "int", 0),
                         ("include_all_ngrams", "bool", False)]),
    ("SpaceToDepthOptions", [("block_size", "int", 0)]),
    ("EmbeddingLookupSparseOptions", [("combiner", "byte", 0)]),
    ("MulOptions", [_ACT]),
    ("PadOptions", []),
    ("GatherOptions", [("axis", "int", 0), ("batch_dims", "int", 0)]),
    ("BatchToSpaceNDOptions", []),
    ("SpaceToBatchNDOptions", []),
    ("TransposeOptions", []),
    ("ReducerOptions", [("keep_dims", "bool", False)]),
    ("SubOptions", [_ACT, ("pot_scale_int16", "bool", True)]),
    ("DivOptions", [_ACT]),
    ("SqueezeOptions", [("squeeze_dims", "[int]", None)]),
    ("SequenceRNNOptions", [("time_major", "bool", False), _ACT,
                            ("asymmetric_quantize_inputs", "bool", False)]),
    ("StridedSliceOptions", [("begin_mask", "int", 0), ("end_mask", "int", 0), ("ellipsis_mask", "int", 0),
                             ("new_axis_mask", "int", 0), ("shrink_axis_mask", "int", 0),
                             ("offset", "bool", False)]),
    ("ExpOptions", []),
    ("TopKV2Options", []),
    ("SplitOptions", [("num_splits", "int", 0)]),
    ("LogSoftmaxOptions", []),
    ("CastOptions", [("in_data_type", "byte", 0), ("out_data_type", "byte", 0)]),
    ("DequantizeOptions", []),
    ("MaximumMinimumOptions", []),
    ("ArgMaxOptions", [("output_type", "byte", 0)]),
    ("LessOptions", []),
    ("NegOptions", []),
    ("PadV2Options", []),
    ("GreaterOptions", []),
    ("GreaterEqualOptions", []),
    ("LessEqualOptions", []),
    ("SelectOptions", []),
    ("SliceOptions", []),
    ("TransposeConvOptions", [("padding", "byte", 0), ("stride_w", "int", 0), ("stride_h", "int", 0), _ACT,
                              ("quantized_bias_type", "byte", 0)]),
    ("SparseToDenseOptions", [("validate_indices", "bool", False)]),
    ("TileOptions", []),
    ("ExpandDimsOptions", []),
    ("EqualOptions", []),
    ("NotEqualOptions", []),
    ("ShapeOptions", [("out_type", "byte", 0)]),
    ("PowOptions", []),
    ("ArgMinOptions", [("output_type", "byte", 0)]),
    ("FakeQuantOptions", [("min", "float", 0.0), ("max", "float", 0.0), ("num_bits", "int", 0),
                          ("narrow_range", "bool", False)]),
    ("PackOptions", [("values_count", "int", 0), ("axis", "int", 0)]),
    ("LogicalOrOptions", []),
    ("OneHotOptions", [("axis", "int", 0)]),
    ("LogicalAndOptions", []),
    ("LogicalNotOptions", []),
    ("UnpackOptions", [("num", "int", 0), ("axis", "int", 0)]),
    ("FloorDivOptions", []),
    ("SquareOptions", []),
    ("ZerosLikeOptions", []),
    ("FillOptions", []),
    ("BidirectionalSequenceLSTMOptions", [_ACT, ("cell_clip", "float", 0.0), ("proj_clip", "float", 0.0),
                                          ("merge_outputs", "bool", False), ("time_major", "bool", True),
                                          ("asymmetric_quantize_inputs", "bool", False)]),
    ("BidirectionalSequenceRNNOptions", [("time_major", "bool", False), _ACT,
                                         ("merge_outputs", "bool", False),
                                         ("asymmetric_quantize_inputs", "bool", False)]),
    ("UnidirectionalSequenceLSTMOptions", [_ACT, ("cell_clip", "float", 0.0), ("proj_clip", "float", 0.0),
                                           ("time_major", "bool", False),
                                           ("asymmetric_quantize_inputs", "bool", False),
                                           ("diagonal_recurrent_tensors", "bool", False)]),
    ("FloorModOptions", []),
    ("RangeOptions", []),
    ("ResizeNearestNeighborOptions", [("align_corners", "bool", False), ("half_pixel_centers", "bool", False)]),
    ("LeakyReluOptions", [("alpha", "float", 0.0)]),
    ("SquaredDifferenceOptions", []),
    ("MirrorPadOptions", [("mode", "byte", 0)]),
    ("AbsOptions", []),
    ("SplitVOptions", [("num_splits", "int", 0)]),
    ("UniqueOptions", [("idx_out_type", "byte", 2)]),
    ("ReverseV2Options", []),
    ("AddNOptions", []),
    ("GatherNdOptions", []),
    ("CosOptions", []),
    ("WhereOptions", []),
    ("RankOptions", []),
    ("ReverseSequenceOptions", [("seq_dim", "int", 0), ("batch_dim", "int", 0)]),
    ("MatrixDiagOptions", []),
    ("QuantizeOptions", []),
    ("MatrixSetDiagOptions", []),
    ("HardSwishOptions", []),
    ("IfOptions", [("then_subgraph_index", "int", 0), ("else_subgraph_index", "int", 0)]),
    ("WhileOptions", [("cond_subgraph_index", "int", 0), ("body_subgraph_index", "int", 0)]),
    ("DepthToSpaceOptions", [("block_size", "int", 0)]),
    ("NonMaxSuppressionV4Options", []),
    ("NonMaxSuppressionV5Options", []),
    ("ScatterNdOptions", []),
    ("SelectV2Options", []),
    ("DensifyOptions", []),
    ("SegmentSumOptions", []),
    ("BatchMatMulOptions", [("adj_x", "bool", False), ("adj_y", "bool", False),
                            ("asymmetric_quantize_inputs", "bool", False)]),
    ("CumsumOptions", [("exclusive", "bool", False), ("reverse", "bool", False)]),
    ("CallOnceOptions", [("init_subgraph_index", "int", 0)]),
    ("BroadcastToOptions", []),
    ("Rfft2dOptions", []),
    ("Conv3DOptions", [("padding", "byte", 0), ("stride_d", "int", 0), ("stride_w", "int", 0),
                       ("stride_h", "int", 0), _ACT, ("dilation_d_factor", "int", 1),
                       ("dilation_w_factor", "int", 1), ("dilation_h_factor", "int", 1)]),
    ("HashtableOptions", [("table_id", "int", 0), ("key_dtype", "byte", 0), ("value_dtype", "byte", 0)]),
    ("HashtableFindOptions", []),
    ("HashtableImportOptions", []),
    ("HashtableSizeOptions", []),
    ("VarHandleOptions", [("container", "string", ""), ("shared_name", "string", "")]),
    ("ReadVariableOptions", []),
    ("AssignVariableOptions", []),
    ("RandomOptions", [("seed", "long", 0), ("seed2", "long", 0)]),
    ("BucketizeOptions", [("boundaries", "[float]", None)]),
    ("GeluOptions", [("approximate", "bool", False)]),
    ("DynamicUpdateSliceOptions", []),
    ("UnsortedSegmentProdOptions", []),
    ("UnsortedSegmentMaxOptions", []),
    ("UnsortedSegmentMinOptions", []),
    ("UnsortedSegmentSumOptions", []),
    ("ATan2Options", []),
    ("SignOptions", []),
    ("BitcastOptions", []),
    ("BitwiseXorOptions", []),
    ("RightShiftOptions", []),
]
OPTIONS_BY_NAME = {name: (i + 1, fields) for i, (name, fields) in enumerate(BUILTIN_OPTIONS)}

_LONGS = "[long]"
# BuiltinOptions2 union members (the StableHLO ops' options), in union order, as above.
# An Operator carries them in slots 11 (type) and 12 (table).
BUILTIN_OPTIONS_2: list[tuple[str, list[tuple[str, str, object]]]] = [
    ("StablehloConcatenateOptions", [("dimension", "long", 0)]),
    ("StablehloBroadcastInDimOptions", [("broadcast_dimensions", _LONGS, None)]),
    ("StablehloSliceOptions", [("start_indices", _LONGS, None), ("limit_indices", _LONGS, None),
                               ("strides", _LONGS, None)]),
    ("StablehloConvolutionOptions", [
        ("window_strides", _LONGS, None), ("padding", _LONGS, None), ("lhs_dilation", _LONGS, None),
        ("rhs_dilation", _LONGS, None), ("window_reversal", "[bool]", None), ("input_batch_dimension", "long", 0),
        ("input_feature_dimension", "long", 0), ("input_spatial_dimensions", _LONGS, None),
        ("kernel_input_feature_dimension", "long", 0), ("kernel_output_feature_dimension", "long", 0),
        ("kernel_spatial_dimensions", _LONGS, None), ("output_batch_dimension", "long", 0),
        ("output_feature_dimension", "long", 0), ("output_spatial_dimensions", _LONGS, None),
        ("feature_group_count", "long", 0), ("batch_group_count", "long", 0), ("precision_config", "[uint]", None)]),
    ("StablehloCustomCallOptions", [("call_target_name", "string", ""), ("has_side_effect", "bool", False),
                                    ("backend_config", "string", ""), ("api_version", "int", 0),
                                    ("called_computations", "[int]", None), ("custom_attributes", "[ubyte]", None)]),
    ("StablehloReduceOptions", [("dimensions", _LONGS, None), ("body_subgraph_index", "int", 0)]),
    ("StablehloScatterOptions", [("indices_are_sorted", "bool", False), ("update_window_dims", _LONGS, None),
                                 ("inserted_window_dims", _LONGS, None),
                                 ("scatter_dims_to_operand_dims", _LONGS, None), ("index_vector_dim", "long", 0),
                                 ("unique_indices", "bool", False), ("update_computation_subgraph_index", "int", 0)]),
    ("StablehloCompareOptions", [("comparison_direction", "uint", 0), ("compare_type", "uint", 0)]),
    ("StablehloDynamicSliceOptions", [("slice_sizes", _LONGS, None)]),
    ("StablehloPadOptions", [("edge_padding_low", _LONGS, None), ("edge_padding_high", _LONGS, None),
                             ("interior_padding", _LONGS, None)]),
    ("StablehloIotaOptions", [("iota_dimension", "long", 0)]),
    ("StablehloDotGeneralOptions", [("lhs_batching_dimensions", _LONGS, None), ("rhs_batching_dimensions", _LONGS, None),
                                    ("lhs_contracting_dimensions", _LONGS, None),
                                    ("rhs_contracting_dimensions", _LONGS, None), ("precision_config", "[uint]", None)]),
    ("StablehloReduceWindowOptions", [("window_dimensions", _LONGS, None), ("window_strides", _LONGS, None),
                                      ("base_dilations", _LONGS, None), ("window_dilations", _LONGS, None),
                                      ("padding", _LONGS, None), ("body_subgraph_index", "int", 0)]),
    ("StablehloSortOptions", [("dimension", "long", 0), ("is_stable", "bool", False),
                              ("comparator_subgraph_index", "int", 0)]),
    ("StablehloWhileOptions", [("cond_subgraph_index", "int", 0), ("body_subgraph_index", "int", 0)]),
    ("StablehloGatherOptions", [("offset_dims", _LONGS, None), ("collapsed_slice_dims", _LONGS, None),
                                ("start_index_map", _LONGS, None), ("index_vector_dim", "long", 0),
                                ("slice_sizes", _LONGS, None), ("indices_are_sorted", "bool", False)]),
    ("StablehloTransposeOptions", [("permutation", _LONGS, None)]),
    ("DilateOptions", []),
    ("StablehloRngBitGeneratorOptions", [("algorithm", "byte", 0)]),
    ("ReduceWindowOptions", [("reduce_function", "int", 0)]),
    ("StableHLOCompositeOptions", [("name", "string", ""), ("decomposition_subgraph_index", "int", 0),
                                   ("composite_attributes", "[ubyte]", None),
                                   ("composite_attributes_format", "byte", 0), ("version", "int", 0)]),
    ("StablehloShiftLeftOptions", []),
    ("StablehloCaseOptions", [("branch_subgraph_indices", "[int]", None)]),
]
OPTIONS_2_BY_NAME = {name: (i + 1, fields) for i, (name, fields) in enumerate(BUILTIN_OPTIONS_2)}


def _options_2_table(op: str) -> str | None:
    """The BuiltinOptions2 table ``op`` carries: STABLEHLO_DOT_GENERAL takes
    StablehloDotGeneralOptions, DILATE DilateOptions; None for an op that takes none."""
    words = op.split("_")
    prefix, rest = ("Stablehlo", words[1:]) if words[0] == "STABLEHLO" else ("", words)
    table = prefix + "".join(w.capitalize() for w in rest) + "Options"
    return "StableHLOCompositeOptions" if op == "STABLEHLO_COMPOSITE" else (
        table if table in OPTIONS_2_BY_NAME else None)


OP_OPTIONS_2: dict[str, str] = {op: t for op in BUILTIN_OPERATORS if (t := _options_2_table(op))}

# Which options table each builtin op carries (ops absent here take none).
OP_OPTIONS: dict[str, str] = {
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions", "L2_POOL_2D": "Pool2DOptions",
    "FULLY_CONNECTED": "FullyConnectedOptions", "SOFTMAX": "SoftmaxOptions",
    "CONCATENATION": "ConcatenationOptions", "ADD": "AddOptions", "SUB": "SubOptions",
    "MUL": "MulOptions", "DIV": "DivOptions", "L2_NORMALIZATION": "L2NormOptions",
    "LOCAL_RESPONSE_NORMALIZATION": "LocalResponseNormalizationOptions", "LSTM": "LSTMOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "RESHAPE": "ReshapeOptions", "SPACE_TO_DEPTH": "SpaceToDepthOptions",
    "DEPTH_TO_SPACE": "DepthToSpaceOptions", "PAD": "PadOptions", "PADV2": "PadV2Options",
    "GATHER": "GatherOptions", "TRANSPOSE": "TransposeOptions", "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions", "REDUCE_ANY": "ReducerOptions", "REDUCE_ALL": "ReducerOptions",
    "SQUEEZE": "SqueezeOptions", "STRIDED_SLICE": "StridedSliceOptions", "SPLIT": "SplitOptions",
    "SPLIT_V": "SplitVOptions", "CAST": "CastOptions", "TRANSPOSE_CONV": "TransposeConvOptions",
    "SHAPE": "ShapeOptions", "PACK": "PackOptions", "UNPACK": "UnpackOptions",
    "LEAKY_RELU": "LeakyReluOptions", "MIRROR_PAD": "MirrorPadOptions", "IF": "IfOptions",
    "WHILE": "WhileOptions", "CALL_ONCE": "CallOnceOptions", "BATCH_MATMUL": "BatchMatMulOptions",
    "VAR_HANDLE": "VarHandleOptions", "GELU": "GeluOptions", "ARG_MAX": "ArgMaxOptions",
    "ARG_MIN": "ArgMinOptions", "CUMSUM": "CumsumOptions", "UNIDIRECTIONAL_SEQUENCE_LSTM":
    "UnidirectionalSequenceLSTMOptions", "ONE_HOT": "OneHotOptions", "CONV_3D": "Conv3DOptions",
}
