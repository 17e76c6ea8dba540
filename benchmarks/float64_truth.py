"""Whose float32 answer is nearer the truth: litegpu's or LiteRT's? Both against the model
evaluated in float64.

usage:
    python benchmarks/float64_truth.py MODEL.tflite [--seeds 0 1 2] [--inputs uniform normal]

The float64 evaluation reuses litegpu's op definitions (attributes, padding and window
geometry, resize taps) with every value in float64; it covers the ops of convolutional
float models (CONV_2D, DEPTHWISE_CONV_2D, ADD, MUL, PAD, RESHAPE, LOGISTIC,
RESIZE_BILINEAR, MAX_POOL_2D and AVERAGE_POOL_2D without padding, RELU/RELU6) and says
which op it lacks otherwise. For each output it prints the max error of each runtime
relative to the largest |value| of the float64 result, and their difference.

pose_landmark_full (MediaPipe; ``pip download mediapipe==0.10.14 --no-deps`` and unzip
``mediapipe/modules/pose_landmark/pose_landmark_full.tflite``) was the model that made this
script: its 256x256 segmentation output differs between the two by up to ~1e-3 of its
scale, and both are that far from the float64 truth (see the closing note of issue 32).
"""
from __future__ import annotations

import argparse

import numpy as np


def _windows(a: np.ndarray, out_hw: tuple[int, int], attrs: dict):
    """The KH x KW strided views of ``a`` (no padding) that a pool reduces."""
    (kh, kw), (sh, sw) = attrs["filter"], attrs["stride"]
    oh, ow = out_hw
    for i in range(kh):
        for j in range(kw):
            yield a[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]


def evaluate_float64(path: str, x: np.ndarray) -> dict[int, np.ndarray]:
    """Every tensor of subgraph 0 computed in float64 from input ``x``."""
    from litegpu.model import load_model
    from litegpu.ops import nn
    from litegpu.ops.registry import apply_activation, get_op

    sg = load_model(path).subgraphs[0]
    tensors = sg.tensors
    env = {sg.inputs[0]: x.astype(np.float64)}

    def value(t: int) -> np.ndarray | None:
        if t < 0:
            return None
        return env[t] if t in env else np.asarray(tensors[t].data).astype(np.float64)

    for node in sg.nodes:
        attrs = get_op(node.op).attrs(node, tensors)
        ins = [value(t) for t in node.inputs]
        out_shape = tuple(tensors[node.outputs[0]].shape)
        bias = ins[2] if len(ins) > 2 and ins[2] is not None else 0.0
        if node.op == "CONV_2D":
            y = nn.conv_sums(ins[0], ins[1], attrs) + bias
        elif node.op == "DEPTHWISE_CONV_2D":
            y = nn.depthwise_sums(ins[0], ins[1], attrs) + bias
        elif node.op in ("ADD", "MUL"):
            y = ins[0] + ins[1] if node.op == "ADD" else ins[0] * ins[1]
        elif node.op == "PAD":
            y = np.pad(ins[0], ins[1].astype(np.int64))
        elif node.op == "RESHAPE":
            y = ins[0].reshape(out_shape)
        elif node.op == "LOGISTIC":
            y = 1.0 / (1.0 + np.exp(-ins[0]))
        elif node.op in ("RELU", "RELU6"):
            y = ins[0]
        elif node.op == "RESIZE_BILINEAR":
            y0, y1, fy = nn.bilinear_axis(ins[0].shape[1], out_shape[1], attrs)
            x0, x1, fx = nn.bilinear_axis(ins[0].shape[2], out_shape[2], attrs)
            fy, fx = fy.astype(np.float64)[None, :, None, None], fx.astype(np.float64)[None, None, :, None]
            a = ins[0]
            top = a[:, y0][:, :, x0] + (a[:, y0][:, :, x1] - a[:, y0][:, :, x0]) * fx
            bottom = a[:, y1][:, :, x0] + (a[:, y1][:, :, x1] - a[:, y1][:, :, x0]) * fx
            y = top + (bottom - top) * fy
        elif node.op in ("MAX_POOL_2D", "AVERAGE_POOL_2D") and attrs["padding"] == "VALID":
            views = list(_windows(ins[0], out_shape[1:3], attrs))
            y = np.maximum.reduce(views) if node.op == "MAX_POOL_2D" else np.mean(views, axis=0)
        else:
            raise SystemExit(f"node {node.index} ({node.op}): no float64 evaluation here")
        activation = node.op if node.op in ("RELU", "RELU6") else attrs.get("activation", "NONE")
        env[node.outputs[0]] = apply_activation(y, activation)
    return env


def main() -> int:
    import litegpu
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--inputs", nargs="*", default=["uniform", "normal"], choices=["uniform", "normal"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    theirs = LiteRT(model_path=args.model, num_threads=args.threads)
    ours = litegpu.Interpreter(model_path=args.model, num_threads=args.threads)
    for interp in (theirs, ours):
        interp.allocate_tensors()
    shape = theirs.get_input_details()[0]["shape"]
    print("| input | output | LiteRT vs float64 | litegpu vs float64 | litegpu vs LiteRT |\n|---|---|---|---|---|")
    for kind in args.inputs:
        for seed in args.seeds:
            rng = np.random.default_rng(seed)
            x = (rng.random(shape) if kind == "uniform" else rng.standard_normal(shape)).astype(np.float32)
            truth = evaluate_float64(args.model, x)
            results = []
            for interp in (theirs, ours):
                interp.set_tensor(interp.get_input_details()[0]["index"], x)
                interp.invoke()
                results.append([interp.get_tensor(d["index"]).astype(np.float64)
                                 for d in interp.get_output_details()])
            for d, want, got in zip(theirs.get_output_details(), *results):
                exact = truth[d["index"]]
                peak = max(float(np.abs(exact).max()), 1e-30)
                errors = [np.abs(want - exact).max(), np.abs(got - exact).max(), np.abs(got - want).max()]
                print(f"| {kind} seed {seed} | {d['name']} {list(exact.shape)} | "
                      + " | ".join(f"{e / peak:.1e}" for e in errors) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
