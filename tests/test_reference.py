"""Every op's numpy reference agrees with LiteRT on every conformance case."""
from __future__ import annotations

import pytest

from litegpu.testing.cases import Case, all_cases
from litegpu.testing.conformance import compare, litert_outputs, reference_outputs

CASES = all_cases()  # a broken case module fails collection here, loudly


def test_there_are_cases():
    assert CASES, "no conformance cases found in litegpu.testing.cases"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_matches_litert(case: Case):
    model_bytes, inputs = case.build()
    want = litert_outputs(model_bytes, inputs)
    got = reference_outputs(model_bytes, inputs)
    compare(got, want, case.tol, f"reference of {case.id}")
