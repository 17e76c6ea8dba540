"""A model's GPU programs rendered without a device: for ``litegpu compile --out`` and
for the source checks of every dialect.

The partitions come from the runtime's own planning (a :class:`~litegpu.session.Session`
compiling each subgraph, a quantized model in its float view as a GPU backend runs it)
with the codegen backends' shared :mod:`.planning`; a stand-in backend keeps each
partition instead of building it.
"""
from __future__ import annotations

from dataclasses import dataclass

from litegpu.backend import Backend, Partition, Program

from . import planning
from .dialect import Dialect
from .nodegen import KernelSpec, Precision
from .render import assemble, partition_kernels


class _Planner(Backend):
    """A GPU backend that plans as the codegen backends of ``dialect`` do and keeps the partitions."""

    name = "codegen-planner"
    is_gpu = True
    host_memory = True   # no device tensors are made: the transfer plan needs none

    def __init__(self, dialect: Dialect) -> None:
        self.dialect_table = dialect
        self.partitions: list[Partition] = []

    def supports(self, node, model):
        return planning.supports(node, model, self.dialect_table)

    def schedule(self, nodes, outputs):
        return planning.schedule(nodes, outputs, self.dialect_table)

    def compile(self, partition, options) -> Program:
        """Keep the partition; the program is never run."""
        self.partitions.append(partition)
        return Program()


def gpu_partitions(model, dialect: Dialect, input_shapes: list[tuple[int, ...]] | None = None
                   ) -> tuple[list[tuple[int, Partition]], list[str]]:
    """((subgraph index, partition) for every GPU partition of ``model`` in ``dialect``'s
    backends, why nodes stayed off).

    ``model`` is a :class:`~litegpu.graph.Model`. Subgraph 0 is planned at
    ``input_shapes`` (default: the model's), the others at their model shapes; control
    flow bodies, which the runtime keeps on cpu, are included so their kernels are rendered too.
    """
    from litegpu.float_view import float_view, is_quantized_model
    from litegpu.session import Session
    if is_quantized_model(model):   # a GPU backend runs its float view, as the session does
        model = float_view(model)
    session = Session(model, [], precision_loss_allowed=True)
    planner = _Planner(dialect)
    session.backends = [planner]
    found, refusals = [], []
    for k, sg in enumerate(model.subgraphs):
        shapes = dict(zip(sg.inputs, input_shapes)) if k == 0 and input_shapes is not None else None
        before = len(planner.partitions)
        compiled = session.compile(k, shapes)
        found += [(k, p) for p in planner.partitions[before:]]
        refusals += [f"{a.op}: {a.reason}" for a in compiled.report.assignments if a.reason]
    return found, refusals


@dataclass
class RenderedProgram:
    """One partition's program in one dialect and precision."""

    subgraph: int
    partition: Partition
    precision: Precision
    step_kernels: list[list[KernelSpec]]
    source: str

    @property
    def launches(self) -> list[dict]:
        """Each launch: kernel name, nodes, global and local sizes (OpenCL's counting)."""
        out = []
        steps = self.partition.steps or [[i] for i in range(len(self.partition.nodes))]
        for step, kernels in zip(steps, self.step_kernels):
            nodes = [f"{self.partition.nodes[p].node.index} {self.partition.nodes[p].node.op}" for p in step]
            out += [{"kernel": f"k_{k.digest}", "nodes": nodes, "global": list(k.global_size),
                     "local": None if k.local_size is None else list(k.local_size)} for k in kernels]
        return out


def render_model(model, dialect: Dialect, precision: Precision,
                 input_shapes: list[tuple[int, ...]] | None = None) -> list[RenderedProgram]:
    """Every GPU program of ``model`` in ``dialect`` and ``precision``."""
    partitions, _ = gpu_partitions(model, dialect, input_shapes)
    out = []
    for k, partition in partitions:
        step_kernels = partition_kernels(partition, precision, dialect)
        out.append(RenderedProgram(k, partition, precision, step_kernels,
                                   assemble(step_kernels, precision, dialect)[0]))
    return out
