"""The shipped conformance suite, run on our own backends, and the harness it relies on.

``test_op`` below is the suite itself, imported from the package: the pytest plugin
parametrizes it over the selected backends (every available one by default).
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.plugins import manager
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import (compare, litegpu_outputs, litert_outputs, max_rel_error,
                                         reference_outputs)
from litegpu.testing.conformance_suite import test_op  # noqa: F401  (collected here, on every backend)


def test_cpu_backend_is_available_so_the_suite_runs():
    ok, why = manager().backend("cpu").available()
    assert ok, why


@pytest.mark.parametrize("got, want, expected", [
    ([1.0, 2.0], [1.0, 2.0], 0.0),
    ([1.0, 2.5], [1.0, 2.0], 0.25),         # 0.5 / max|want| = 0.5 / 2
    ([10.5, 0.0], [10.0, 0.0], 0.05),       # relative to max|want|
    ([0.25], [0.0], 0.25),                  # max|want| < 1: divide by 1
    ([np.nan], [np.nan], 0.0),
    ([np.nan], [1.0], float("inf")),
    ([np.inf], [np.inf], 0.0),
    ([np.inf], [1.0], float("inf")),
])
def test_max_rel_error_floats(got, want, expected):
    err = max_rel_error(np.array(got, np.float32), np.array(want, np.float32))
    assert err == pytest.approx(expected)


def test_max_rel_error_is_exact_for_ints_bools_and_shapes():
    assert max_rel_error(np.array([1, 2], np.int32), np.array([1, 2], np.int32)) == 0
    assert max_rel_error(np.array([1, 3], np.int32), np.array([1, 2], np.int32)) == float("inf")
    assert max_rel_error(np.array([True]), np.array([False])) == float("inf")
    assert max_rel_error(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")
    assert max_rel_error(np.zeros((0, 3)), np.zeros((0, 3))) == 0


def test_compare_names_the_output_and_checks_dtype():
    a = np.ones(3, np.float32)
    compare([a], [a.copy()], 0.0)
    with pytest.raises(AssertionError, match="output 0 has dtype float64"):
        compare([a.astype(np.float64)], [a], 1.0)
    with pytest.raises(AssertionError, match="output 1 differs"):
        compare([a, a], [a, a + 1], 1e-3)


def _two_op_model(shape=(2, 3)):
    b = ModelBuilder()
    x = b.input("x", shape, np.float32, shape_signature=(-1,) + tuple(shape[1:]))
    c = b.const("c", np.array([0.5, -1.0, 2.0], np.float32))
    y = b.tensor("y", shape, np.float32)
    b.op("MUL", [x, c], [y])
    z = b.tensor("z", shape, np.float32)
    b.op("ADD", [y, x], [z], fused_activation_function="RELU")
    b.output(z, y)
    return b.build()


def test_harness_runs_litert_reference_and_litegpu_alike():
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    c = np.array([0.5, -1.0, 2.0], np.float32)
    want = [np.maximum(x * c + x, 0), x * c]
    data = _two_op_model()
    for got in (litert_outputs(data, [x]), reference_outputs(data, [x]), litegpu_outputs(data, [x], "cpu")):
        assert [g.shape for g in got] == [(2, 3), (2, 3)]
        compare(got, want, 1e-6)


def test_harness_resizes_inputs_of_other_shapes():
    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    data = _two_op_model()
    want = litert_outputs(data, [x])
    assert want[0].shape == (4, 3)
    compare(reference_outputs(data, [x]), want, 1e-6)
    compare(litegpu_outputs(data, [x], "cpu"), want, 1e-6)


def test_reference_evaluator_runs_control_flow():
    b = ModelBuilder()
    i0 = b.input("i", (), np.int32)
    out = b.tensor("out", (), np.int32)
    cond = b.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    keep = cond.tensor("keep", (), np.bool_)
    cond.op("LESS", [ci, cond.const("limit", np.array(7, np.int32))], [keep])
    cond.output(keep)
    body = b.subgraph("body")
    bi = body.input("i", (), np.int32)
    nxt = body.tensor("next", (), np.int32)
    body.op("ADD", [bi, body.const("two", np.array(2, np.int32))], [nxt])
    body.output(nxt)
    b.op("WHILE", [i0], [out], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    b.output(out)
    data = b.build()
    start = [np.array(0, np.int32)]
    assert int(litert_outputs(data, start)[0]) == 8
    compare(reference_outputs(data, start), litert_outputs(data, start), 0)


# -- case collection ------------------------------------------------------------------

def _extra_case_dir(tmp_path, monkeypatch, name: str, source: str):
    """Add a case module to litegpu.testing.cases through its package path."""
    import sys

    import litegpu.testing.cases as cases_pkg
    folder = tmp_path / "extra_cases"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    monkeypatch.setattr(cases_pkg, "__path__", list(cases_pkg.__path__) + [str(folder)])
    monkeypatch.delitem(sys.modules, f"litegpu.testing.cases.{name}", raising=False)
    return cases_pkg


_GOOD_CASES = '''
import numpy as np
from litegpu.testing.cases import Case
from litegpu.testing.builder import ModelBuilder

def _build():
    b = ModelBuilder()
    x = b.input("x", (2, 2), np.float32)
    y = b.tensor("y", (2, 2), np.float32)
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build(), [np.arange(4, dtype=np.float32).reshape(2, 2)]

CASES = [Case("ZZADD", "b-second", _build), Case("ZZADD", "a-first", _build)]
'''


def test_all_cases_collects_extra_modules_sorted_by_id(tmp_path, monkeypatch):
    pkg = _extra_case_dir(tmp_path, monkeypatch, "zz_good", _GOOD_CASES)
    ids = [c.id for c in pkg.all_cases()]
    assert "ZZADD-a-first" in ids and ids.index("ZZADD-a-first") == ids.index("ZZADD-b-second") - 1
    assert ids == sorted(ids)


@pytest.mark.parametrize("source, error", [
    ("import not_a_module_anywhere\nCASES = []\n", ModuleNotFoundError),
    ("CASES = None\n", TypeError),
    ("CASES = ['not a case']\n", TypeError),
    (_GOOD_CASES.replace('"b-second"', '"a-first"'), ValueError),
])
def test_a_broken_case_module_fails_loudly(tmp_path, monkeypatch, source, error):
    pkg = _extra_case_dir(tmp_path, monkeypatch, "zz_broken", source)
    with pytest.raises(error):
        pkg.all_cases()


# -- the pytest plugin, through pytester ---------------------------------------------------

pytest_plugins = ["pytester"]

_FAKE_BACKENDS = '''
import litegpu.testing.cases as cases_pkg
from litegpu.backend import Backend, Support
from litegpu.hookspecs import hookimpl
from litegpu.plugins import manager

class Refuser(Backend):
    name = "fake"
    def supports(self, node, model):
        return Support(False, "fake runs nothing")

class Broken(Backend):
    name = "broken"
    def available(self):
        return False, "no device here"

class FakePlugin:
    @hookimpl
    def litegpu_backends(self):
        return [Refuser(), Broken()]

manager().register(FakePlugin(), "fakes")
cases_pkg.__path__.append(EXTRA)
'''

_PLAIN_TESTS = '''
import pytest

def test_a(backend):
    assert isinstance(backend, str)

@pytest.mark.parametrize("x", ["p-q"])
def test_b(backend, x):
    pass
'''


@pytest.fixture
def fake_env(pytester, tmp_path, monkeypatch):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "zz_plugin_cases.py").write_text(_GOOD_CASES)
    # Loaded with -p (not as a conftest) so it also applies to --pyargs runs of the shipped suite.
    pytester.makepyfile(fakes_plugin=_FAKE_BACKENDS.replace("EXTRA", repr(str(extra))))
    pytester.makepyfile(test_plain=_PLAIN_TESTS)
    monkeypatch.delenv("LITEGPU_TEST_BACKENDS", raising=False)
    return pytester


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "fakes_plugin", *args)


def _ids(result) -> list[str]:
    return [line.split("::", 1)[1].split(" ")[0] for line in result.outlines if "::" in line]


def test_plugin_parametrizes_with_stable_ids(fake_env):
    result = _run(fake_env, "test_plain.py", "-v", "--litegpu-backend", "fake", "--litegpu-backend", "cpu")
    ids = _ids(result)
    assert ids == ["test_a[fake]", "test_a[cpu]", "test_b[fake-p-q]", "test_b[cpu-p-q]"]
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["litegpu backends tested: fake, cpu (from --litegpu-backend)"])


def _assert_usage_error(result, *lines: str) -> None:
    """The run stopped before any test, exit code 4, the reason and the alternatives on stderr."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.ret, result.outlines[-20:], result.errlines)
    assert not any("passed" in line or "skipped" in line for line in result.outlines), result.outlines
    for line in (*lines, "available litegpu backends: *cpu*fake*"):
        result.stderr.fnmatch_lines([line])


@pytest.mark.parametrize("args", [
    ["--litegpu-backend", "nosuch"],
    ["--litegpu-backend", "fake,nosuch"],
    ["--litegpu-backend", "cpu", "--litegpu-backend", "nosuch", "-k", "no_test_matches_this"],
])
def test_plugin_an_unknown_backend_named_is_a_usage_error(fake_env, args):
    result = _run(fake_env, "test_plain.py", *args)
    _assert_usage_error(result, "ERROR: --litegpu-backend names 'nosuch', but no installed plugin provides*")


def test_plugin_an_unavailable_backend_named_is_a_usage_error_saying_why(fake_env):
    result = _run(fake_env, "test_plain.py", "--litegpu-backend", "broken")
    _assert_usage_error(result, "ERROR: --litegpu-backend names 'broken', which cannot be used here: no device here",
                        "installed but unavailable: *broken (no device here)*")


def test_plugin_checks_names_even_where_no_test_uses_a_backend(fake_env):
    fake_env.makepyfile(test_nobackend="def test_x():\n    pass\n")
    result = _run(fake_env, "test_nobackend.py", "--litegpu-backend", "nosuch")
    _assert_usage_error(result, "*names 'nosuch'*")


@pytest.mark.parametrize("value, message", [
    ("cpu,nosuch", "ERROR: $LITEGPU_TEST_BACKENDS names 'nosuch', but no installed plugin provides*"),
    ("broken", "ERROR: $LITEGPU_TEST_BACKENDS names 'broken', which cannot be used here: no device here"),
    (" , ", "ERROR: $LITEGPU_TEST_BACKENDS is set but names no backend"),
])
def test_plugin_a_bad_environment_variable_is_a_usage_error(fake_env, monkeypatch, value, message):
    monkeypatch.setenv("LITEGPU_TEST_BACKENDS", value)
    _assert_usage_error(_run(fake_env, "test_plain.py"), message)


def test_plugin_reads_the_environment_and_the_option_wins(fake_env, monkeypatch):
    monkeypatch.setenv("LITEGPU_TEST_BACKENDS", "fake, cpu")
    result = _run(fake_env, "test_plain.py", "-v")
    assert [i for i in _ids(result) if i.startswith("test_a")] == ["test_a[fake]", "test_a[cpu]"]
    result.assert_outcomes(passed=4)
    monkeypatch.setenv("LITEGPU_TEST_BACKENDS", "broken")   # not consulted when the option is given
    result = _run(fake_env, "test_plain.py", "-v", "--litegpu-backend", "fake")
    assert [i for i in _ids(result) if i.startswith("test_a")] == ["test_a[fake]"]
    result.assert_outcomes(passed=2)


def test_plugin_default_is_every_available_backend_and_says_what_it_left_out(fake_env):
    result = _run(fake_env, "test_plain.py", "-v")
    names = sorted(i[len("test_a["):-1] for i in _ids(result) if i.startswith("test_a["))
    assert "cpu" in names and "fake" in names and "broken" not in names
    assert names == sorted([n for n, b in manager().backends.items() if b.available()[0]] +
                           (["fake"] if "fake" not in manager().backends else []))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["litegpu backend 'broken' left out, unavailable here: no device here"])


_RAISING_BACKEND = '''
from litegpu.backend import Backend
from litegpu.hookspecs import hookimpl
from litegpu.plugins import manager

class Raising(Backend):
    name = "raising"
    def available(self):
        raise RuntimeError("probe crashed")

class RaisingPlugin:
    @hookimpl
    def litegpu_backends(self):
        return [Raising()]

manager().register(RaisingPlugin(), "raising")
'''


def test_plugin_a_backend_whose_probe_raises_is_an_error_even_by_default(fake_env):
    fake_env.makepyfile(raising_plugin=_RAISING_BACKEND)
    result = fake_env.runpytest_subprocess("-p", "raising_plugin", "test_plain.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:]
    result.stderr.fnmatch_lines(["ERROR: litegpu backend 'raising': available() raised RuntimeError: probe crashed"])


def test_shipped_suite_skips_refused_nodes_with_reason_but_cpu_runs_everything(fake_env):
    result = _run(fake_env, "--pyargs", "litegpu.testing.conformance_suite", "-v", "-rs",
                                           "--litegpu-backend", "fake", "--litegpu-backend", "cpu",
                                           "-k", "ZZADD")
    ids = _ids(result)
    assert "test_op[cpu-ZZADD-a-first]" in ids and "test_op[fake-ZZADD-b-second]" in ids
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*fake does not support node 0 (ADD) of subgraph 0: fake runs nothing*"])


# -- opencl's refusals are known ones ------------------------------------------------------
# A case opencl refuses skips on opencl (cpu still runs it against LiteRT). A regression in
# ``supports`` would turn failures into skips, so every refusal must be one of these:
# (op or "*", words its reason contains). Growing this table is a decision, not a side effect.
_OPENCL_MAY_REFUSE = [
    ("*", "output shape depends on tensor values (dynamic)"),
    ("*", "tensor type complex64 is not supported"),
    ("CAST", "tensor type float16 is not supported"),
    ("CAST", "tensor type float64 is not supported"),
    ("CAST", "tensor type uint16 is not supported"),
    ("CAST", "tensor type uint32 is not supported"),
    ("SIGN", "tensor type float64 is not supported"),
    ("CUMSUM", "operation is not supported"),
    ("FILL", "operation is not supported"),
    ("ONE_HOT", "operation is not supported"),
    # Values LiteRT refuses at run time (an integer divisor of zero, an index out of range)
    # that a kernel cannot report: cpu raises LiteRT's error instead of a silent answer
    # (decided for the resize sweep's "0 silent wrong answers").
    ("*", "by a run-time divisor"),
    ("*", "indices known only at run time"),
    # A hybrid lookup of run-time ids (refused for its ids as above) keeps its quantized table
    # in the float view, for the cpu's lookup (not a float copy of the whole table).
    ("EMBEDDING_LOOKUP", "quantized integer arithmetic runs on cpu"),
]


def test_opencl_refuses_only_what_it_is_known_to_refuse(opencl):
    from litegpu.testing.cases import all_cases
    from litegpu.testing.conformance import unsupported
    unexpected, refused_cases = [], 0
    for case in all_cases():
        model_bytes, _ = case.build()
        refused = unsupported(model_bytes, opencl)
        refused_cases += bool(refused)
        for _, node, op, answer in refused:
            if not any(o in ("*", op) and words in answer.reason for o, words in _OPENCL_MAY_REFUSE):
                unexpected.append(f"{case.id}: node {node} ({op}): {answer.reason}")
    assert not unexpected, "opencl newly refuses:\n" + "\n".join(unexpected)
    assert refused_cases < len(all_cases()) // 4, refused_cases
