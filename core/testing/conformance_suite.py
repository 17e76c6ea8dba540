"""The conformance suite: every case on a backend, compared with LiteRT.

A test module shipped inside the package, so a backend author runs it against their
own backend without a copy of our tests::

    pytest --pyargs litegpu.testing.conformance_suite --litegpu-backend mine

The ``backend`` fixture comes from :mod:`litegpu.testing.pytest_plugin`. A case is
skipped, with the backend's own reason, when the backend says it cannot run one of
the case's nodes — except on ``cpu``, which must run every case. Naming a backend
that is not installed, or not usable here, stops the run with a usage error (exit 4)
listing the backends that are: a misspelling must never pass as 667 skips.

``--litegpu-precision f16`` runs every case in F16 (LiteRT's ``precision_loss_allowed``) on
a GPU backend: LiteRT gets the inputs rounded to fp16, as the device stores them, and the
tolerance widens to :data:`~litegpu.testing.conformance.FP16_TOL` (quantized cases:
:data:`~litegpu.testing.conformance.FP16_QUANTA` more quanta). A backend that is not a GPU
(cpu) has no F16 mode, so its cases skip saying so. ``--litegpu-precision f32_f16`` does the
same with float arithmetic over the half storage (the ``half_arithmetic`` delegate option off)::

    pytest --pyargs litegpu.testing.conformance_suite --litegpu-backend cuda --litegpu-precision f16
"""
from __future__ import annotations

import pytest

# Absolute imports on purpose: pytest may import this file under another name (e.g.
# ``core.testing.conformance_suite`` from a source checkout), and the cases, backends
# and plugin state must still be litegpu's own.
from litegpu.plugins import manager
from litegpu.testing.cases import Case, all_cases
from litegpu.testing.conformance import check_f16, compare, litegpu_outputs, litert_outputs, unsupported

__all__ = ["test_op"]

FALLBACK_BACKEND = "cpu"

CASES = all_cases()
if not CASES:
    # An empty parametrization would collect nothing and pass: a suite that cannot fail.
    raise RuntimeError("litegpu.testing.cases holds no conformance case; the suite would test nothing")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op(backend: str, case: Case, litegpu_precision: str) -> None:
    """litegpu on ``backend`` matches LiteRT on ``case`` within ``case.tol`` (F16: see above)."""
    if litegpu_precision != "f32" and not manager().backend(backend).is_gpu:
        pytest.skip(f"{backend} is not a GPU backend: it computes in fp32 and has no half modes")
    model_bytes, inputs = case.build()
    if backend != FALLBACK_BACKEND:
        refused = unsupported(model_bytes, manager().backend(backend))
        if refused:
            sg, node, op, answer = refused[0]
            pytest.skip(f"{backend} does not support node {node} ({op}) of subgraph {sg}: "
                        f"{answer.reason or 'no reason given'}")
    if litegpu_precision != "f32":
        mode = litegpu_precision.upper()
        why = check_f16(model_bytes, inputs, backend, case.tol, case.quanta, f"{case.id} on {backend} in {mode}",
                        half_arithmetic=litegpu_precision == "f16")
        if why:
            pytest.skip(why)
        return
    want = litert_outputs(model_bytes, inputs)
    got = litegpu_outputs(model_bytes, inputs, backend)
    compare(got, want, case.tol, f"{case.id} on {backend}", case.quanta)
