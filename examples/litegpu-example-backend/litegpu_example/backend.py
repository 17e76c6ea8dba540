"""The example backend: what it supports, how it compiles, how its programs run."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from litegpu.backend import COMPLETE, Backend, CompileOptions, Event, NodeContext, Partition, Program, Support
from litegpu.graph import Model

from .kernels import ACTIVATIONS, FUSED, KERNELS

_F32 = np.dtype(np.float32)


class ExampleBackend(Backend):
    """Float32 elementwise ops on the host, in numpy; everything else is declined."""

    name = "example"

    def available(self) -> tuple[bool, str]:
        """Always available: it needs nothing but numpy."""
        return True, ""

    def device_info(self) -> dict:
        """Describes the (host) device."""
        return {"device": "host CPU (numpy)", "numpy": np.__version__, "ops": sorted(KERNELS)}

    def supports(self, node: NodeContext, model: Model) -> Support:
        """Yes for a float32, statically shaped node of an op in the kernel table."""
        op = node.node.op
        if op not in KERNELS:
            return Support(False, f"the example backend has no kernel for {op}")
        if node.dynamic:
            return Support(False, "output shape known only at run time")
        specs = [*node.inputs, *node.outputs]
        if any(s is None for s in specs):
            return Support(False, "omitted optional input")
        dtypes = sorted({str(np.dtype(s.dtype)) for s in specs} - {"float32"})
        if dtypes:
            return Support(False, f"only float32 is supported, the node uses {', '.join(dtypes)}")
        activation = node.attrs.get("activation", "NONE") if op in FUSED else "NONE"
        if activation not in ACTIVATIONS:
            return Support(False, f"fused activation {activation} is not supported")
        return Support(True)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        """A flat list of kernel calls over tensor slots, constants captured now."""
        constants: dict[int, np.ndarray] = {}
        steps = []
        for ctx in partition.nodes:
            for t, spec in zip(ctx.node.inputs, ctx.inputs):
                if spec is not None and spec.value is not None:
                    constants[t] = np.asarray(spec.value, dtype=_F32)
            steps.append((KERNELS[ctx.node.op], tuple(ctx.node.inputs), tuple(ctx.node.outputs), ctx.attrs))
        return ExampleProgram(steps, list(partition.inputs), list(partition.outputs), constants)


class ExampleProgram(Program):
    """Runs the kernels of one partition in order on host arrays."""

    def __init__(self, steps: list, inputs: list[int], outputs: list[int], constants: dict[int, np.ndarray]):
        self.steps = steps
        self.inputs = inputs
        self.outputs = outputs
        self.constants = constants

    def run(self, inputs: Sequence[np.ndarray], outputs: list, wait_for: Sequence[Event] = ()) -> Event:
        """Compute the partition; results are written into ``outputs`` in place."""
        values = dict(self.constants)
        values.update(zip(self.inputs, inputs))
        for kernel, ins, outs, attrs in self.steps:
            for t, result in zip(outs, kernel([values[i] for i in ins], attrs)):
                values[t] = result
        for pos, t in enumerate(self.outputs):
            if outputs[pos] is None:  # no preallocated array: hand ours back
                outputs[pos] = values[t]
            else:
                outputs[pos][...] = values[t]
        return COMPLETE
