"""GPU acceptance: one command that checks litegpu on an NVIDIA machine and prints one report.

A GPU machine (NVIDIA H100 or H200, CUDA 13, Python 3.12, no network) is lent rarely and
for minutes, so everything it should tell us runs from one command inside a hard time
budget (8 minutes by default), and everything that could not run is listed with why.

Here, before borrowing the machine (fills .wheelhouse/, git-ignored; needs the network)::

    python benchmarks/gpu_acceptance.py --download

That fetches the wheels listed in gpu_acceptance_wheels.txt (CPython 3.12, manylinux
x86_64, --no-deps), the Vulkan loader's .debs (libvulkan1, libglvnd0) in case the machine
lacks them, and copies the shared models that fit a size budget plus a few fetched real
models (``carry`` cannot name ../shared/models: the device tool sends the checkout and
paths inside it only); it prints the sizes against the 64 MiB that may travel (about 57
MiB: 25.5 wheels, 29 models, 3 the tree). Then, with the device tool::

    run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_acceptance.py --wheelhouse .wheelhouse --out $OUT",
        carry=[".wheelhouse"], timeout_s=600)

Back come $OUT/report.md (also printed), $OUT/results.json (every raw number) and
$OUT/acceptance.log. The script's budget (--budget, 480 s) covers the install too; with
the machine's start (1-2 minutes) one call spends about 10 of a session's 15 device
minutes, which leaves room for one narrower rerun (``--models mobilenet_v2``,
``--conformance-k CONV_2D``, ``--budget 200``). Without a GPU (here, CI) the same command
runs what needs none and reports the rest as not run, with the reason; ``--quick`` (one
built model, a few conformance cases, few invokes) is what tests/test_gpu_acceptance.py runs.

The decoders (litegpu's generation against LiteRT-LM's, on tiny and 100M bundles) are a
second call with its own wheelhouse, since LiteRT-LM's wheel alone is 47 MB
(acceptance_decoders.py)::

    python benchmarks/gpu_acceptance.py --download --decoders     # here: fills .wheelhouse-lm/
    run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_acceptance.py --decoders --wheelhouse .wheelhouse-lm --out $OUT --budget 240",
        carry=[".wheelhouse-lm"], timeout_s=300)

Made right after the first call, it finds the machine still warm; give the first
``--budget 400`` then, so that both fit the session's 15 device minutes.

What it does (the report's sections; the parts run cuda first, see plan()). Each part
that can run here gets a share of the time left, by its weight against the parts still
to run (a part that ends early leaves its time to the rest; one that finds too little is
reported "not run: out of time"); every part that touches a driver runs in a child
process with a timeout, so a crash or a hang is a line in the report, and a model that
crashes its worker is that model's error, not the part's:

1. install: the carried wheels whose distributions are missing go into a private folder on
   PYTHONPATH (pip --no-index --no-deps --target); litegpu itself by ``pip install
   --no-index --no-build-isolation --no-deps -e .`` (entry points need installed metadata),
   or, where that fails (no setuptools, read-only site-packages), from the tree: links to
   the import packages plus a written ``.dist-info`` with the entry points. It says which.
2. environment: nvidia-smi, the Vulkan loader and NVIDIA's Vulkan ICD (VK_DRIVER_FILES),
   NVIDIA's OpenCL ICD (written for the ICD loader when only the library is there), every
   litegpu backend's availability, the WebGPU adapter, whether LiteRT's GPU accelerator starts.
3. the conformance suite (``pytest --pyargs litegpu.testing.conformance_suite``) on cuda,
   webgpu and opencl, in F32 and F16 (``--litegpu-precision f16``).
4. the models (shared float and quantized ones, fetched real ones, or built ones when none
   were carried) on each runtime against LiteRT's cpu outputs, and their timing: litegpu
   cuda / webgpu / opencl (F32 and F16) / cpu, LiteRT GPU (its WebGPU accelerator, F32 and
   F16) and LiteRT cpu, at batch 1 and batch 8 where the batch is dynamic. Each runtime is
   timed against LiteRT cpu in one process, in alternating blocks (timing.py).
5. creation, cold (every cache empty) and warm (a second process), per runtime (startup.py's timer).

A GPU backend on a CPU device (opencl on PoCL, webgpu on lavapipe) runs where no GPU is
present, labelled as a CPU device; on a machine with an NVIDIA GPU it runs only on NVIDIA's
driver (opencl: NVIDIA's ICD; webgpu: NVIDIA's Vulkan ICD).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "gpu_acceptance_worker.py"
WHEELS_FILE = HERE / "gpu_acceptance_wheels.txt"
DEFAULT_WHEELHOUSE = REPO / ".wheelhouse"
DECODERS_WHEELHOUSE = REPO / ".wheelhouse-lm"     # --decoders: its own call, its own carry
SHARED_MODELS = (REPO.parent / "shared" / "models").resolve()
CARRY_LIMIT = 64 * 2**20          # what the device tool moves: working tree plus carried paths
DEFAULT_BUDGET_S = 480
QUICK_BUDGET_S = 150
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64", "manylinux1_x86_64")
VULKAN_DEBS = ("libvulkan1", "libglvnd0")
VULKAN_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
NVIDIA_VULKAN_ICD = Path("/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json")
NVIDIA_LIB_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
                   "/usr/lib64", "/lib/x86_64-linux-gnu")
# Shared models carried, in this order while they fit the budget: the small ones first,
# then the real ones, then the large nets (mobilenet_v2 is the one the timings are read by).
SMALL_SHARED = ("dynamic_batch_mlp", "elementwise_200", "lstm_classifier", "stateful_counter", "tiny_bert",
                "tiny_bert_dynamic", "unet_small", "unet_small_int16x8", "mobilenet_v3_small_int8",
                "mobilenet_v2_int8")
LARGE_SHARED = ("mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "resnet18_fp16")
REAL_CARRIED = ("face_landmark", "blazeface_full_range", "oww_embedding")
# --decoders: these bundles of benchmarks/export_decoders.py, tiny and (but f32) 100M.
CARRIED_DECODERS = ("llama_f32_comp", "llama_int8_dynamic_comp", "llama_int4_block32_comp")
GPU_BACKENDS = ("cuda", "webgpu", "opencl")
LITERT_LM_GPU, LITERT_LM_CPU = "litert-lm-gpu", "litert-lm-cpu"
LITERT_GPU, LITERT_CPU = "litert-gpu", "litert-cpu"
MODEL_RUNTIMES = ("cuda", LITERT_GPU, "cpu", "webgpu", "opencl")
# The GPU ones LiteRT's first, then the cheap ones, then those slow cold (numba, PoCL).
CREATION_RUNTIMES = ("cuda", LITERT_GPU, LITERT_CPU, "webgpu", "cpu", "opencl")
# --quick leaves out litegpu's cold creation: numba compiling every cpu kernel takes 10-20 s cold.
QUICK_CREATION_RUNTIMES = (LITERT_CPU,)
QUICK_CONFORMANCE = "SOFTMAX and rank"     # 8 cases: enough to see the suite run, in seconds
F32_TOL, F16_TOL, QUANTA_TOL = 1e-3, 5e-2, 2    # accuracy cells above these are marked
CACHE_VARS_EXTRA = ("CUDA_CACHE_PATH",)          # NVIDIA's JIT and OpenCL binary cache


log = logging.getLogger("gpu_acceptance")


# -- time ----------------------------------------------------------------------------------------
@dataclass
class Budget:
    """The run's deadline; ``reserve`` seconds are kept for writing the report."""

    total: float
    reserve: float = 10.0
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        """Seconds left for parts."""
        return self.total - self.reserve - (time.monotonic() - self.start)

    def grant(self, cap: float, minimum: float) -> float | None:
        """Seconds a part may take: ``cap`` or what is left; None when less than ``minimum`` is left."""
        left = self.left()
        return None if left < minimum else min(cap, left)

    def used(self) -> float:
        return time.monotonic() - self.start


@dataclass
class Outcome:
    """One part's line in the report."""

    part: str
    status: str          # "ok", "failed", "partial" or "not run"
    detail: str = ""
    seconds: float = 0.0


@dataclass
class ModelSpec:
    """A model file to run, and where it came from (carried, shared, fetched, built)."""

    name: str
    path: Path
    source: str

    @property
    def mb(self) -> float:
        return self.path.stat().st_size / 1e6


@dataclass
class Run:
    """Everything one acceptance run learns, rendered at the end."""

    args: argparse.Namespace
    budget: Budget
    workdir: Path
    env: dict[str, str]
    facts: dict[str, str] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    not_run: list[tuple[str, str]] = field(default_factory=list)
    probe: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)
    models: list[ModelSpec] = field(default_factory=list)
    conformance: dict[str, dict] = field(default_factory=dict)
    rows: dict[str, dict[str, dict]] = field(default_factory=dict)
    creation: dict[str, dict] = field(default_factory=dict)
    litert_gpu: str = "not probed"
    decoders: list = field(default_factory=list)               # acceptance_decoders.Carried
    decoder_rows: dict[str, dict[str, dict]] = field(default_factory=dict)

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if outcome.status == "not run":
            self.not_run.append((outcome.part, outcome.detail))
        log.info("%s: %s %s", outcome.part, outcome.status, outcome.detail[:200])


# -- child processes -----------------------------------------------------------------------------
@dataclass
class ChildResult:
    """How a child process ended: its exit status (None if killed), output and wall time."""

    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool


def run_child(cmd: list[str], timeout: float, env: dict[str, str], cwd: Path | None = None) -> ChildResult:
    """Run ``cmd`` in its own session; at ``timeout`` kill its whole process group (pytest's
    xdist workers, a driver's threads) so nothing outlives the part."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd, start_new_session=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    return ChildResult(proc.returncode, out, err, time.monotonic() - start, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group this script started for ``proc`` (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _sibling_modules() -> None:
    """Make this folder's modules (startup, acceptance_decoders) importable, late: on
    sys.path from the start, its timing.py and models.py would shadow others' modules."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def worker_cmd(*args: str) -> list[str]:
    return [sys.executable, str(WORKER), *args]


def tail(text: str, lines: int = 4) -> str:
    """The last meaningful lines of a child's output (LiteRT's INFO chatter left out)."""
    keep = [ln.strip() for ln in text.splitlines()
            if ln.strip() and not ln.startswith(("INFO:", "WARNING: [npu", "WARNING: [compiler_plugin"))
            and "openvino" not in ln.lower()]
    return " | ".join(keep[-lines:])[:600]


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# -- install --------------------------------------------------------------------------------------
def _dist_name(wheel: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    name, version = wheel.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _installed(name: str) -> str:
    """The version of distribution ``name`` this interpreter has, or ``""``."""
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def install_wheels(run: Run, site: Path) -> None:
    """Install the carried wheels this interpreter lacks into ``site`` (on PYTHONPATH)."""
    wheelhouse = Path(run.args.wheelhouse)
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        run.facts["wheels"] = f"none carried ({wheelhouse} has no .whl)"
        return
    present = {w: _installed(_dist_name(w)[0]) for w in wheels}
    missing = [w for w, v in present.items() if not v]
    have = ", ".join(f"{_dist_name(w)[0]} {v}" for w, v in present.items() if v)
    if not missing:
        run.facts["wheels"] = f"all already installed ({have})"
        return
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--find-links", str(wheelhouse), "--target", str(site),
           *map(str, missing)]
    res = run_child(cmd, 180, run.env)
    names = ", ".join(f"{n} {v}" for n, v in map(_dist_name, missing))
    if res.rc == 0:
        run.facts["wheels"] = f"installed into {site}: {names}" + (f"; already there: {have}" if have else "")
    else:
        run.facts["wheels"] = f"pip failed (rc {res.rc}) installing {names}: {tail(res.err)}"


def _litegpu_check(env: dict[str, str]) -> tuple[bool, str]:
    """Whether ``litegpu`` imports from this tree with its backend entry points."""
    code = ("import importlib.metadata as m, litegpu; "
            "print(litegpu.__file__); print(sorted(e.name for e in m.entry_points(group='litegpu.backends')))")
    res = run_child([sys.executable, "-c", code], 120, env)
    lines = res.out.strip().splitlines()
    if res.rc != 0 or len(lines) < 2:
        return False, tail(res.err) or f"rc {res.rc}"
    ok = Path(lines[0]).resolve().is_relative_to(REPO / "core") and "cpu" in lines[1]
    return ok, f"{lines[0]}, backends {lines[1]}"


def install_from_tree(site: Path) -> str:
    """Make ``site`` import litegpu from this tree: a link per import package (pyproject's
    package-dir) and a ``.dist-info`` holding the entry points, which plugin discovery and
    pytest's plugin loading read."""
    import tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dirs = project["tool"]["setuptools"]["package-dir"]
    site.mkdir(parents=True, exist_ok=True)
    for package, folder in package_dirs.items():
        link = site / package
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(REPO / folder, target_is_directory=True)
    meta = project["project"]
    info = site / f"{meta['name']}-{meta['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
              for group, entries in meta.get("entry-points", {}).items()]
    groups.append("[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in meta.get("scripts", {}).items()))
    (info / "entry_points.txt").write_text("\n".join(groups))
    (info / "INSTALLER").write_text("gpu_acceptance\n")
    return f"from the tree: links in {site} and a written {info.name}"


def install_litegpu(run: Run, site: Path) -> None:
    """litegpu importable from this tree, by the first way that works; the report says which."""
    ok, where = _litegpu_check(run.env)
    if ok and run.args.install != "tree":
        run.facts["litegpu install"] = f"already installed from this tree ({where})"
        return
    tried = []
    if run.args.install in ("auto", "pip"):
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
               "--disable-pip-version-check", "-e", str(REPO)]
        res = run_child(cmd, 180, run.env)
        ok, where = _litegpu_check(run.env) if res.rc == 0 else (False, tail(res.err))
        if ok:
            run.facts["litegpu install"] = f"pip install --no-index --no-build-isolation --no-deps -e . ({where})"
            return
        tried.append(f"pip editable failed: {where}")
    how = install_from_tree(site)
    ok, where = _litegpu_check(run.env)
    run.facts["litegpu install"] = f"{how} ({where})" + (f"; {'; '.join(tried)}" if tried else "")
    if not ok:
        run.facts["litegpu install"] += " -- litegpu does NOT import: every part below will fail"


def install(run: Run) -> None:
    """Wheels, then litegpu; both only as far as this interpreter lacks them."""
    start = time.monotonic()
    site = run.workdir / "site"
    site.mkdir(parents=True, exist_ok=True)
    run.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), run.env.get("PYTHONPATH", "")]))
    install_wheels(run, site)
    install_litegpu(run, site)
    broken = "does NOT import" in run.facts["litegpu install"] or run.facts["wheels"].startswith("pip failed")
    detail = run.facts["wheels"][:60] + "; litegpu " + run.facts["litegpu install"][:100]
    run.record(Outcome("install", "failed" if broken else "ok", detail, time.monotonic() - start))


# -- environment ------------------------------------------------------------------------------------
def _ldconfig_path(soname: str) -> str:
    """Where the dynamic loader finds ``soname``, or ``""``."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in listing.splitlines():
        if line.strip().startswith(soname + " ") and "=>" in line:
            return line.split("=>", 1)[1].strip()
    return ""


def nvidia_gpu(run: Run) -> None:
    """nvidia-smi's view of the GPU, or why there is none."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        run.facts["GPU"] = "none: nvidia-smi not found (no NVIDIA driver here)"
        return
    for fields in ("name,driver_version,memory.total,compute_cap", "name,driver_version,memory.total"):
        res = run_child([exe, f"--query-gpu={fields}", "--format=csv,noheader"], 30, run.env)
        if res.rc == 0 and res.out.strip():
            values = [v.strip() for v in res.out.strip().splitlines()[0].split(",")]
            run.gpu = dict(zip(fields.split(","), values))
            run.facts["GPU"] = ", ".join(f"{k} {v}" for k, v in run.gpu.items())
            return
    run.facts["GPU"] = f"none: nvidia-smi failed ({tail(res.err or res.out)})"


def _unpack_debs(run: Run) -> str:
    """Unpack the carried Vulkan loader .debs into a private root; its lib folder, or ``""``."""
    debs = sorted((Path(run.args.wheelhouse) / "debs").glob("*.deb"))
    if not debs or not shutil.which("dpkg"):
        return ""
    root = run.workdir / "vulkan-root"
    for deb in debs:
        # A private root, not /: the device README warns that unpacking into / can break it.
        subprocess.run(["dpkg", "-x", str(deb), str(root)], capture_output=True, timeout=60)
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    return str(libdir) if (libdir / "libvulkan.so.1").exists() else ""


def vulkan(run: Run) -> None:
    """The Vulkan loader and glvnd's dispatch library (carried where missing: NVIDIA's ICD
    needs both) and NVIDIA's ICD, for webgpu and LiteRT GPU."""
    missing = [so for so in ("libvulkan.so.1", "libGLdispatch.so.0") if not _ldconfig_path(so)]
    if not missing:
        run.facts["Vulkan loader"] = f"system ({_ldconfig_path('libvulkan.so.1')})"
    else:
        libdir = _unpack_debs(run)
        if libdir:
            run.env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, run.env.get("LD_LIBRARY_PATH", "")]))
            run.facts["Vulkan loader"] = f"{', '.join(missing)} missing: carried .debs unpacked into {libdir}"
        else:
            run.facts["Vulkan loader"] = f"{', '.join(missing)} missing, and no carried .deb (or no dpkg)"
    icds = [p for d in VULKAN_ICD_DIRS for p in sorted(Path(d).glob("*.json"))]
    nvidia = [p for p in icds if "nvidia" in p.name.lower()]
    if nvidia:
        run.facts["Vulkan ICDs"] = ", ".join(str(p) for p in icds)
    elif NVIDIA_VULKAN_ICD.exists():
        # The driver's folder holds NVIDIA's ICD where the loader does not look by default.
        run.env["VK_DRIVER_FILES"] = run.env["VK_ICD_FILENAMES"] = str(NVIDIA_VULKAN_ICD)
        run.facts["Vulkan ICDs"] = f"VK_DRIVER_FILES={NVIDIA_VULKAN_ICD}"
        nvidia = [NVIDIA_VULKAN_ICD]
    else:
        run.facts["Vulkan ICDs"] = (", ".join(str(p) for p in icds) or "none") + " (no NVIDIA ICD)"
    if nvidia:
        _headless_icd(run, nvidia[0])


def _headless_icd(run: Run, icd: Path) -> None:
    """NVIDIA's ICD file names libGLX_nvidia.so.0, whose vkCreateInstance fails without an X
    display (seen on the H100 machine, 2026-11-28: "Could not get 'vkCreateInstance' via
    'vk_icdGetInstanceProcAddr'"); the same driver's libEGL_nvidia.so.0 runs headless. Write
    an ICD file naming that, point the loader at it, and put the driver's folder (a mount
    ldconfig's cache does not list) on LD_LIBRARY_PATH for its own dependencies."""
    try:
        meta = json.loads(icd.read_text())
        named = meta["ICD"]["library_path"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        run.facts["Vulkan ICD library"] = f"unreadable {icd}: {type(exc).__name__}: {exc}"
        return
    egl = _find_library("libEGL_nvidia.so.0")
    if "GLX" not in named or not egl:
        run.facts["Vulkan ICD library"] = f"{named} (as {icd} names it)"
        return
    meta["ICD"]["library_path"] = egl
    headless = run.workdir / "vulkan" / "nvidia_headless_icd.json"
    headless.parent.mkdir(parents=True, exist_ok=True)
    headless.write_text(json.dumps(meta))
    run.env["VK_DRIVER_FILES"] = run.env["VK_ICD_FILENAMES"] = str(headless)
    folder = str(Path(egl).parent)
    run.env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [run.env.get("LD_LIBRARY_PATH", ""), folder]))
    run.facts["Vulkan ICD library"] = (f"{egl} in place of {named} (headless: no X display), "
                                       f"VK_DRIVER_FILES={headless}, {folder} on LD_LIBRARY_PATH")


def _find_library(soname: str) -> str:
    found = _ldconfig_path(soname)
    if found:
        return found
    for folder in NVIDIA_LIB_DIRS:
        if (Path(folder) / soname).exists():
            return str(Path(folder) / soname)
    return ""


def opencl(run: Run) -> None:
    """NVIDIA's OpenCL ICD: the system's, or one written for the ICD loader (OCL_ICD_VENDORS)
    when the driver's library is there without it; on an NVIDIA machine litegpu is pointed
    at NVIDIA's platform so it never falls back to a CPU driver."""
    system = sorted(Path("/etc/OpenCL/vendors").glob("*.icd"))
    nvidia = [p for p in system if "nvidia" in (p.name + p.read_text(errors="replace")).lower()]
    if nvidia:
        run.facts["OpenCL ICD"] = f"NVIDIA's: {nvidia[0]}"
    else:
        lib = _find_library("libnvidia-opencl.so.1")
        if lib:
            vendors = run.workdir / "OpenCL" / "vendors"
            vendors.mkdir(parents=True, exist_ok=True)
            (vendors / "nvidia.icd").write_text(lib + "\n")
            run.env["OCL_ICD_VENDORS"] = str(vendors)
            run.facts["OpenCL ICD"] = f"NVIDIA's library {lib}, ICD written to {vendors} (OCL_ICD_VENDORS)"
        else:
            others = ", ".join(p.name for p in system) or "none"
            run.facts["OpenCL ICD"] = f"no NVIDIA ICD (libnvidia-opencl.so.1 not found); system ICDs: {others}"
            return
    if run.gpu:
        run.env["LITEGPU_OPENCL_PLATFORM"] = "NVIDIA"


def probe(run: Run) -> None:
    """litegpu's backends and the WebGPU adapter, read in a child (a driver may crash it)."""
    # The Vulkan loader's own errors say which driver library failed to load, and why.
    res = run_child(worker_cmd("probe"), 90, {**run.env, "VK_LOADER_DEBUG": "error"}, cwd=run.workdir)
    run.probe = last_json(res.out) or {}
    if not run.probe:
        run.facts["probe"] = f"failed: {'timed out' if res.timed_out else tail(res.err)}"
        return
    adapter = run.probe.get("wgpu_adapter", {})
    run.facts["WebGPU adapter"] = adapter.get("error") or \
        f"{adapter.get('device', '?')} ({adapter.get('backend_type', '?')}, {adapter.get('adapter_type', '?')})"
    if adapter.get("error"):
        loader = [ln.strip() for ln in res.err.splitlines() if "ERROR" in ln or "loader" in ln.lower()]
        run.facts["Vulkan loader errors"] = " | ".join(dict.fromkeys(loader))[:600] or "none printed"


def litert_gpu_probe(run: Run) -> None:
    """Whether LiteRT's GPU accelerator starts at all; the reason from its log when not."""
    if not run.probe.get("packages", {}).get("ai-edge-litert"):
        run.litert_gpu = "ai-edge-litert is not installed"
        return
    model = run.workdir / "models" / "built_convnet.tflite"
    res = run_child(worker_cmd("create", LITERT_GPU, str(model)), 90, run.env, cwd=run.workdir)
    if last_json(res.out):
        run.litert_gpu = ""
        return
    # Dawn's and LiteRT's own words, without the INFO chatter and the source locations.
    lines = [ln.strip() for ln in res.err.splitlines() if not ln.startswith(("INFO", "E0000"))
             and re.search(r"no adapters|load vulkan|required|failed to initialize", ln, re.I)]
    why = " | ".join(dict.fromkeys(lines)) or tail(res.err)
    run.litert_gpu = f"LiteRT's GPU accelerator did not start: {why[:400]}"


def litert_lm_python(run: Run) -> str:
    """The Python that runs LiteRT-LM's rows: this one, unless --litert-lm-python names another."""
    return run.args.litert_lm_python or sys.executable


def litert_lm_probe(run: Run) -> None:
    """Whether LiteRT-LM's Python package imports (in the Python its rows run in)."""
    python = litert_lm_python(run)
    code = "import importlib.metadata as m, litert_lm; print(m.version('litert-lm-api'))"
    res = run_child([python, "-c", code], 60, run.env)
    run.facts["LiteRT-LM"] = f"litert-lm-api {res.out.strip()} ({python})" if res.rc == 0 else \
        f"litert_lm does not import with {python}: {tail(res.err)}"


def environment(run: Run) -> None:
    """What this machine offers each runtime, and the built models (the probes need one)."""
    start = time.monotonic()
    nvidia_gpu(run)
    vulkan(run)
    opencl(run)
    probe(run)
    if run.args.decoders:
        litert_lm_probe(run)
    else:
        build = run_child(worker_cmd("build-models", str(run.workdir / "models"),
                                     *(["--quick"] if run.args.quick else [])), 120, run.env, cwd=run.workdir)
        run.facts["built models"] = ", ".join(last_json(build.out) or {}) or f"failed: {tail(build.err)}"
        litert_gpu_probe(run)
    status = "ok" if run.probe else "failed"
    run.record(Outcome("environment", status, run.facts.get("GPU", ""), time.monotonic() - start))


# -- what can run -------------------------------------------------------------------------------------
def _device_is_cpu(info: dict) -> bool:
    return str(info.get("device", {}).get("type", "")).upper() == "CPU"


def unusable(run: Run, runtime: str) -> str:
    """Why ``runtime`` cannot run here, or ``""``."""
    packages = run.probe.get("packages", {})
    if not run.probe:
        return "the environment probe failed (litegpu did not import)"
    if runtime in (LITERT_LM_GPU, LITERT_LM_CPU):
        lm = run.facts.get("LiteRT-LM", "not probed")
        if not lm.startswith("litert-lm-api"):
            return f"LiteRT-LM: {lm}"
        if runtime == LITERT_LM_GPU and not run.gpu:
            return ("no NVIDIA GPU here (LiteRT-LM's GPU backend is WebGPU over Vulkan, where Dawn offers it "
                    "no CPU adapter)")
        return ""
    if runtime in (LITERT_CPU, LITERT_GPU) or runtime in run.probe.get("backends", {}):
        # The decoders part compares with LiteRT's answers computed before it travelled.
        if not packages.get("ai-edge-litert") and not run.args.decoders:
            return "ai-edge-litert is not installed (every comparison is against LiteRT)"
    if runtime == LITERT_CPU:
        return ""
    if runtime == LITERT_GPU:
        if run.gpu and "cpu" in run.facts.get("WebGPU adapter", "").lower():
            return f"Vulkan offers no NVIDIA adapter ({run.facts['WebGPU adapter']})"
        return run.litert_gpu
    backend = run.probe.get("backends", {}).get(runtime)
    if backend is None:
        names = ", ".join(run.probe.get("backends", {})) or "none"
        failed = run.probe.get("plugin_errors", {}).get(runtime)
        return (f"its plugin failed to load: {failed}" if failed else
                f"no installed litegpu plugin provides a backend named {runtime!r} (installed: {names})")
    if not backend["available"]:
        return f"unavailable: {backend['why']}"
    if run.gpu and backend["is_gpu"] and _device_is_cpu(backend):
        # PoCL or lavapipe on a machine lent for its GPU: minutes better spent elsewhere.
        driver = run.facts.get("OpenCL ICD", "") if runtime == "opencl" else run.facts.get("Vulkan ICDs", "")
        return f"its device is {backend['device'].get('device', '?')}, a CPU, not NVIDIA's GPU ({driver})"
    return ""


def device_label(run: Run, runtime: str) -> str:
    """A footnote for a runtime that ran on a CPU device (PoCL, lavapipe): not a GPU figure."""
    backend = run.probe.get("backends", {}).get(runtime, {})
    if backend and backend.get("is_gpu") and _device_is_cpu(backend):
        return f"{runtime} ran on {backend['device'].get('device', '?')}, a CPU device: not a GPU figure"
    return ""


# -- conformance ----------------------------------------------------------------------------------------
def parse_junit(path: Path) -> dict:
    """Counts, failures (test id, first line of the message) and skip reasons of a junit file."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    summary = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0, "failed": [], "skips": Counter()}
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            summary[key] += int(suite.get(key, 0))
        summary["time"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            for tag in ("failure", "error"):
                for node in case.findall(tag):
                    message = (node.get("message") or node.text or "").strip().splitlines()
                    summary["failed"].append((case.get("name", "?"), message[0][:300] if message else ""))
            for node in case.findall("skipped"):
                reason = re.sub(r"node \d+", "node N", (node.get("message") or "").strip())
                summary["skips"][reason[:160]] += 1
    summary["passed"] = summary["tests"] - summary["failures"] - summary["errors"] - summary["skipped"]
    summary["skips"] = dict(summary["skips"].most_common(5))
    return summary


def _pytest_extras(run: Run) -> list[str]:
    """xdist workers where there are cores for them, a per-test timeout where pytest-timeout is."""
    packages = run.probe.get("packages", {})
    extra = []
    cores = os.cpu_count() or 1
    if packages.get("pytest-xdist") and cores >= 4 and not run.args.quick:
        extra += ["-n", str(min(8, cores // 2))]
    if packages.get("pytest-timeout"):
        extra += ["--timeout", "60"]
    k = QUICK_CONFORMANCE if run.args.quick and run.args.conformance_k is None else run.args.conformance_k
    return extra + (["-k", k] if k else [])


def conformance(run: Run, backend: str, precision: str, seconds: float) -> Outcome:
    """The shipped conformance suite on ``backend`` in ``precision``, within ``seconds``."""
    part = f"conformance {backend} {precision.upper()}"
    xml = run.workdir / f"conformance-{backend}-{precision}.xml"
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "litegpu.testing.conformance_suite", "--litegpu-backend",
           backend, "--litegpu-precision", precision, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           *_pytest_extras(run)]
    res = run_child(cmd, seconds, run.env, cwd=run.workdir)
    summary = parse_junit(xml) if xml.exists() and not res.timed_out else {}
    summary.update({"rc": res.rc, "seconds": res.seconds, "command": " ".join(cmd[1:])})
    run.conformance[f"{backend} {precision}"] = summary
    if res.timed_out:
        return Outcome(part, "partial", f"out of time after {res.seconds:.0f} s: {tail(res.out, 2)}", res.seconds)
    if "tests" not in summary:
        return Outcome(part, "failed", f"pytest rc {res.rc}: {tail(res.out + res.err)}", res.seconds)
    failed = summary["failures"] + summary["errors"]
    counts = f"{summary['passed']} passed, {failed} failed, {summary['skipped']} skipped"
    status = "ok" if res.rc == 0 and failed == 0 else "failed"
    return Outcome(part, status, counts, res.seconds)


# -- models ---------------------------------------------------------------------------------------------
def _sha_ok(path: Path, manifest: dict) -> bool:
    want = manifest.get("files", {}).get(path.relative_to(Path(manifest["root"])).as_posix(), {}).get("sha256")
    return want is None or hashlib.sha256(path.read_bytes()).hexdigest() == want


def find_models(run: Run) -> None:
    """The carried (or local) shared and real models; the built ones where none were found."""
    built = sorted((run.workdir / "models").glob("*.tflite"))
    if run.args.quick:
        run.models = [ModelSpec(p.stem, p, "built") for p in built if p.stem == "built_convnet"]
        return
    wheelhouse = Path(run.args.wheelhouse).resolve()
    manifest = {"root": str(wheelhouse)}
    if (wheelhouse / "manifest.json").exists():
        manifest.update(json.loads((wheelhouse / "manifest.json").read_text()))
    folders = [Path(run.args.models_dir)] if run.args.models_dir else [wheelhouse / "models" / "shared", SHARED_MODELS]
    shared = next((f for f in folders if f.is_dir() and any(f.glob("*.tflite"))), None)
    specs = [ModelSpec(p.stem, p, f"shared ({shared})") for p in sorted(shared.glob("*.tflite"))] if shared else []
    specs += [ModelSpec(p.stem, p, "real (carried)") for p in sorted((wheelhouse / "models" / "real").glob("*.tflite"))]
    bad = [s for s in specs if s.path.is_relative_to(wheelhouse) and not _sha_ok(s.path, manifest)]
    for s in bad:
        run.not_run.append((f"model {s.name}", "its sha256 differs from the wheelhouse manifest"))
    specs = [s for s in specs if s not in bad]
    if not any(s.source.startswith("shared") for s in specs):
        specs += [ModelSpec(p.stem, p, "built (no shared models found)") for p in built]
    if run.args.models:
        wanted = set(run.args.models.split(","))
        specs = [s for s in specs if s.name in wanted]
    # mobilenet_v2 first (the timings are read by it), then small to large: more models finish.
    run.models = sorted(specs, key=lambda s: (s.name != "mobilenet_v2", s.mb))


def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return lines


def supervise(cmd: list[str], env: dict, results: Path, per_model: float, deadline: float,
              cwd: Path) -> tuple[str, str]:
    """Run a models worker until it exits, stalls on one model for ``per_model`` seconds, or
    reaches ``deadline``; (how it ended, its stderr's tail)."""
    err_path = results.with_suffix(".stderr")
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        seen, last_start, ended = 0, time.monotonic(), ""
        while proc.poll() is None:
            lines = _read_results(results)
            if len(lines) > seen:
                if any("start" in ln for ln in lines[seen:]):
                    last_start = time.monotonic()
                seen = len(lines)
            now = time.monotonic()
            if now > deadline or now - last_start > per_model:
                ended = "deadline" if now > deadline else f"stalled over {per_model:.0f} s"
                _kill_group(proc)
                proc.wait()
                break
            time.sleep(0.2)
        ended = ended or f"exit {proc.returncode}"
    return ended, tail(err_path.read_text(errors="replace"))


def _worker_options(run: Run, runtime: str) -> list[str]:
    a = run.args
    options = ["--threads", str(a.threads), "--runs", str(a.runs), "--rounds", str(a.rounds),
               "--block-s", str(a.block_s)]
    if a.quick and device_label(run, runtime):
        # A GPU backend on a CPU device (PoCL) compiles slowly: --quick keeps to F32 at batch 1 there.
        options += ["--no-f16", "--no-batch8"]
    return options


def supervised_rows(run: Run, rows: dict, items: list[tuple[str, str]], command: Callable[[list[str]], list[str]],
                    results: Path, deadline: float) -> None:
    """A row in ``rows`` for each ``(name, spec)`` of ``items``, from worker processes
    ``command(["NAME=SPEC", ...])`` that write ``results`` (a start and a done line per item):
    an item that crashes or hangs its worker is its row's error, and the next worker goes on
    from the item after it."""
    pending = list(items)
    while pending and deadline - time.monotonic() > 5:
        ended, err = supervise(command([f"{name}={spec}" for name, spec in pending]), run.env, results,
                               run.args.per_model_s, deadline, run.workdir)
        started = [ln["start"] for ln in _read_results(results) if "start" in ln]
        for line in _read_results(results):
            if "done" in line:
                rows[line["done"]] = line["row"]
        unfinished = [name for name, _ in pending if name in started and name not in rows]
        for name in unfinished:
            rows[name] = {"error": f"worker {ended} during this one: {err}"} if ended != "deadline" else \
                {"not_run": "out of time (it was running at the part's deadline)"}
        if not started or ended == "deadline":
            if not started and ended != "deadline":  # the worker died before its first item
                for name, _ in pending:
                    rows[name] = {"error": f"worker {ended} before any: {err}"}
            pending = [item for item in pending if item[0] not in rows]
            break
        pending = [item for item in pending if item[0] not in rows]
    for name, _ in pending:
        rows[name] = {"not_run": "out of time"}


def models_part(run: Run, runtime: str, seconds: float) -> Outcome:
    """Every model on ``runtime`` (see supervised_rows)."""
    start = time.monotonic()
    rows = run.rows.setdefault(runtime, {})
    results = run.workdir / f"models-{runtime}.jsonl"
    # On a CPU device (PoCL) mobilenet_v2 alone can take the whole part: small models first.
    models = sorted(run.models, key=lambda m: m.mb) if device_label(run, runtime) else list(run.models)
    command = lambda specs: worker_cmd("models", runtime, str(results), *specs,  # noqa: E731
                                       *_worker_options(run, runtime))
    supervised_rows(run, rows, [(m.name, str(m.path)) for m in models], command, results, start + seconds)
    return _models_outcome(f"models {runtime}", rows, time.monotonic() - start)


def find_decoders(run: Run) -> None:
    """The carried bundles (the hollow ones refilled): int8, then INT4, then float weights,
    the tiny size before the 100M one of each, so that a part out of time has both sizes."""
    _sibling_modules()
    from acceptance_decoders import find_bundles
    found, bad = find_bundles(Path(run.args.wheelhouse).resolve(), run.workdir / "decoders")
    kind = lambda name: next((i for i, k in enumerate(("int8", "int4")) if k in name), 2)  # noqa: E731
    run.decoders = sorted(found, key=lambda c: (kind(c.name), c.shape["params"]))
    run.not_run += [(f"decoder {name}", why) for name, why in bad]


def decoders_part(run: Run, runtime: str, seconds: float) -> Outcome:
    """Every carried bundle on ``runtime``: a litegpu backend or LiteRT-LM's (see supervised_rows)."""
    start = time.monotonic()
    rows = run.decoder_rows.setdefault(runtime, {})
    results = run.workdir / f"decoders-{runtime}.jsonl"
    items = []
    for bundle in run.decoders:
        spec = run.workdir / "decoders" / f"{bundle.name}.spec.json"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps({"path": str(bundle.path), "reference": str(bundle.reference),
                                    "shape": bundle.shape}))
        items.append((bundle.name, str(spec)))
    lm = runtime in (LITERT_LM_GPU, LITERT_LM_CPU)
    python = litert_lm_python(run) if lm else sys.executable
    # A LiteRT-LM round creates its engine afresh (its benchmark's way): one round fewer.
    rounds = max(1, run.args.rounds - 1) if lm else run.args.rounds
    command = lambda specs: [python, str(WORKER), "decode", runtime, str(results), *specs,  # noqa: E731
                             "--threads", str(run.args.threads), "--rounds", str(rounds)]
    supervised_rows(run, rows, items, command, results, start + seconds)
    return _models_outcome(f"decoders {runtime}", rows, time.monotonic() - start)


def _models_outcome(part: str, rows: dict, seconds: float) -> Outcome:
    errors = [n for n, r in rows.items() if "error" in r]
    skipped = [n for n, r in rows.items() if "not_run" in r]
    done = len(rows) - len(errors) - len(skipped)
    detail = f"{done} ran, {len(errors)} failed, {len(skipped)} out of time"
    status = "failed" if errors else "partial" if skipped else "ok"
    return Outcome(part, status, detail + (f" (failed: {', '.join(errors)})" if errors else ""), seconds)


# -- creation ---------------------------------------------------------------------------------------------
def creation_part(run: Run, seconds: float) -> Outcome:
    """Cold (every cache empty) and warm (second process) creation per runtime, one model."""
    start = time.monotonic()
    deadline = start + seconds
    model = run.models[0] if run.models else None
    runtimes = QUICK_CREATION_RUNTIMES if run.args.quick else CREATION_RUNTIMES
    usable = []
    for runtime in CREATION_RUNTIMES:
        why = "--quick times LiteRT cpu's creation only" if runtime not in runtimes else \
            "no model" if model is None else unusable(run, runtime)
        if why:
            run.creation[runtime] = {"not_run": why}
        else:
            usable.append(runtime)
    for i, runtime in enumerate(usable):
        # An even share of what is left (at least 30 s: a cold NVRTC or numba start needs it), so
        # one slow cold start cannot starve the rest; the slow ones (numba, PoCL) come last.
        left = deadline - time.monotonic()
        share = max(left / (len(usable) - i), min(left, 30.0))
        run.creation[runtime] = _cold_and_warm(run, runtime, model, time.monotonic() + share)
    run.facts["creation model"] = model.name if model else "none"
    failed = [r for r, v in run.creation.items() if "error" in v]
    status = "failed" if failed else "ok"
    return Outcome("creation", status, f"model {run.facts['creation model']}" +
                   (f"; failed: {', '.join(failed)}" if failed else ""), time.monotonic() - start)


def _cold_and_warm(run: Run, runtime: str, model: ModelSpec, deadline: float) -> dict:
    """Two processes on one set of fresh cache folders: the first cold, the second warm."""
    _sibling_modules()
    from startup import CACHE_VARS  # what "cold" empties, as the startup benchmark does
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="caches-", dir=run.workdir) as tmp:
        env = {**run.env, **{var: str(Path(tmp) / var.lower()) for var in (*CACHE_VARS, *CACHE_VARS_EXTRA)}}
        for kind in ("cold", "warm"):
            left = deadline - time.monotonic()
            if left < 5:
                out[kind] = {"not_run": "out of time"}
                continue
            limit = min(left, run.args.per_model_s)
            # Two threads, as startup.py's timer gives litegpu: creation hardly depends on them.
            res = run_child(worker_cmd("create", runtime, str(model.path), "--threads", "2"), limit, env,
                            cwd=run.workdir)
            phases = last_json(res.out)
            if phases is not None:
                out[kind] = {**phases, "process": res.seconds}
            elif res.timed_out and limit < run.args.per_model_s:
                out[kind] = {"not_run": f"out of time (its share was {limit:.0f} s)"}
                break   # warm after an unfinished cold start would be a second cold one
            else:
                return {"error": f"{kind}: " + (f"over {limit:.0f} s" if res.timed_out else tail(res.err))}
    return out


# -- the plan ---------------------------------------------------------------------------------------------
@dataclass
class Step:
    """One part of the plan: what it needs, its weight in the budget, and how to run it."""

    part: str
    runtime: str
    weight: float          # its share of the time left, against the steps still to run
    minimum: float         # below this much time for it, it is not started
    action: Callable[[Run, float], Outcome]


def plan(decoders: bool = False) -> list[Step]:
    """In order of what the machine is lent for: cuda first, then the comparisons, then the rest."""
    conf = lambda b, p: (lambda run, s: conformance(run, b, p, s))  # noqa: E731
    models = lambda r: (lambda run, s: models_part(run, r, s))  # noqa: E731
    if decoders:
        # The pair the issue asks for first and best funded (a LiteRT-LM round builds its
        # engine afresh: weights uploaded, shaders compiled); the CPU rows are the extra.
        runtimes = ((LITERT_LM_GPU, 80), ("cuda", 110), ("webgpu", 50), ("opencl", 40), ("cpu", 30),
                    (LITERT_LM_CPU, 30))
        return [Step(f"decoders {r}", r, w, 15, lambda run, s, r=r: decoders_part(run, r, s)) for r, w in runtimes]
    steps = [Step("conformance cuda F32", "cuda", 100, 20, conf("cuda", "f32")),
             Step("models cuda", "cuda", 110, 20, models("cuda")),
             Step(f"models {LITERT_GPU}", LITERT_GPU, 60, 15, models(LITERT_GPU)),
             Step("models cpu", "cpu", 60, 15, models("cpu")),
             Step("conformance cuda F16", "cuda", 60, 20, conf("cuda", "f16")),
             Step("creation", "", 100, 15, creation_part)]
    for backend in ("webgpu", "opencl"):
        steps += [Step(f"conformance {backend} F32", backend, 70, 20, conf(backend, "f32")),
                  Step(f"models {backend}", backend, 70, 15, models(backend)),
                  Step(f"conformance {backend} F16", backend, 50, 20, conf(backend, "f16"))]
    return steps


def execute(run: Run) -> None:
    """Say why for each step that cannot run here; give each other step its weight's share
    of the time left (a step that ends early leaves its time to the ones after it)."""
    runnable = []
    wanted = [w.strip() for w in (run.args.parts or "").split(",") if w.strip()]
    for step in plan(run.args.decoders):
        if wanted and not any(w in step.part for w in wanted):
            continue
        why = unusable(run, step.runtime) if step.runtime else ""
        if step.part.startswith("models") and not run.models:
            why = why or "no model found or built"
        if step.part.startswith("decoders") and not run.decoders:
            why = why or f"no decoder bundles in {run.args.wheelhouse} (--download --decoders makes them)"
        if why:
            run.record(Outcome(step.part, "not run", why))
        else:
            runnable.append(step)
    for i, step in enumerate(runnable):
        share = step.weight / sum(s.weight for s in runnable[i:])
        seconds = run.budget.grant(run.budget.left() * share, step.minimum)
        if seconds is None:
            run.record(Outcome(step.part, "not run", f"out of time ({run.budget.left():.0f} s left)"))
            continue
        log.info("%s: up to %.0f s", step.part, seconds)
        try:
            run.record(step.action(run, seconds))
        except Exception as exc:  # a bug in this script must still leave a report
            log.exception("%s failed", step.part)
            run.record(Outcome(step.part, "failed", f"{type(exc).__name__} in gpu_acceptance.py: {exc}"))


# -- the report ---------------------------------------------------------------------------------------------
def _fmt_err(err: dict | None, tol: float) -> str:
    """One accuracy cell: relative float error and/or integer quanta; over the bound in bold."""
    if not err:
        return ""
    if err.get("mismatch"):
        return f"**{err['mismatch']}**"
    parts = []
    if err.get("rel") is not None:
        parts.append(f"{err['rel']:.1e}")
    if err.get("quanta") is not None:
        parts.append(f"±{err['quanta']}q")
    bad = (err.get("rel") or 0) > tol or (err.get("quanta") or 0) > QUANTA_TOL or err.get("nonfinite")
    text = " ".join(parts) + (" NaN/Inf" if err.get("nonfinite") else "")
    return f"**{text}**" if bad else text


def _columns(run: Run) -> list[tuple[str, str, str]]:
    """(runtime, precision, header) of every result column that has a number somewhere."""
    cols = []
    for runtime in ("cuda", "webgpu", "opencl", "cpu", LITERT_GPU):
        for precision in ("f32", "f16"):
            has = any(precision in cell.get("ms", {}) for row in run.rows.get(runtime, {}).values()
                      for cell in row.get("batches", {}).values())
            if has:
                name = "LiteRT GPU" if runtime == LITERT_GPU else f"litegpu {runtime}"
                cols.append((runtime, precision, f"{name} {precision.upper()}" if runtime != "cpu" else name))
    return cols


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; a "|" inside a cell (LiteRT's log lines have them) would split it."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]


def _model_batches(run: Run, model: str) -> list[str]:
    batches = {b for rows in run.rows.values() for b in rows.get(model, {}).get("batches", {})}
    return sorted(batches, key=int)


def accuracy_section(run: Run) -> list[str]:
    cols = _columns(run)
    out = ["## Models against LiteRT cpu", "",
           "max |litegpu - LiteRT| / max |LiteRT| over the outputs (±Nq: integer outputs, in quanta), "
           f"on the same seeded inputs; bold: over {F32_TOL:g} (F32), {F16_TOL:g} (F16) or {QUANTA_TOL} quanta. "
           "Nodes: on the backend / in the main subgraph.", ""]
    if not cols:
        return out + ["Nothing ran.", ""]
    body = []
    for model in run.models:
        for batch in _model_batches(run, model.name) or ["1"]:
            cells = [model.name, batch]
            for runtime, precision, _ in cols:
                row = run.rows.get(runtime, {}).get(model.name, {})
                cell = _accuracy_cell(row, batch, precision)
                if precision == "f32" and row.get("nodes") and batch == "1" and "error" not in row:
                    cell += f" ({row['nodes']})"
                cells.append(cell)
            body.append(cells)
    out += _table(["model", "batch", *[c[2] for c in cols]], body)
    errors = [f"- {runtime} {name}: {row['error'][:400]}" for runtime, rows in run.rows.items()
              for name, row in rows.items() if "error" in row]
    return out + _footnotes(run, cols) + (["", "Errors:", "", *errors] if errors else []) + [""]


def _accuracy_cell(row: dict, batch: str, precision: str) -> str:
    """One runtime's error on one model at one batch and precision, or what went wrong."""
    cell = row.get("batches", {}).get(batch, {})
    if "error" in cell:
        return f"error: {cell['error'][:80]}"
    text = _fmt_err(cell.get("err", {}).get(precision), F16_TOL if precision == "f16" else F32_TOL)
    if not text and precision == "f16" and "f16_error" in row:
        return f"error: {row['f16_error'][:80]}"
    return text or _row_problem(row)


def _row_problem(row: dict) -> str:
    if "error" in row:
        return f"error: {row['error'][:80]}"
    if "not_run" in row:
        return "not run"
    return "" if row else "-"


def _absent(run: Run, cols: list[tuple[str, str, str]]) -> str:
    """The runtimes with no column, and why (their models part's outcome)."""
    shown = {c[0] for c in cols}
    why = {o.part.split(" ", 1)[1]: o.detail for o in run.outcomes if o.part.startswith("models ")}
    gone = [f"{r} ({why.get(r, 'no result')[:160]})" for r in MODEL_RUNTIMES if r not in shown]
    return f"No column: {'; '.join(gone)}." if gone else ""


def _footnotes(run: Run, cols: list[tuple[str, str, str]]) -> list[str]:
    notes = [device_label(run, r) for r in dict.fromkeys(c[0] for c in cols)] + [_absent(run, cols)]
    if any(c[0] == LITERT_GPU for c in cols):
        notes.append(f"LiteRT GPU is compared with LiteRT's cpu CompiledModel (same API); the Vulkan adapter: "
                     f"{run.facts.get('WebGPU adapter', '?')}")
    return [""] + [f"- {n}" for n in notes if n]


def timing_section(run: Run) -> list[str]:
    cols = _columns(run)
    out = ["## Timing", "",
           "ms per call, host to host (set inputs, run, read every output); best block median of alternating "
           f"blocks, each runtime paired with LiteRT cpu in its own process ({run.args.threads} threads for both "
           "cpu runtimes); (×N): time / the paired LiteRT cpu time, under 1 is faster.", ""]
    if not cols:
        return out + ["Nothing ran.", ""]
    body = []
    for model in run.models:
        for batch in _model_batches(run, model.name):
            cells, base = [model.name, batch], []
            for runtime, precision, _ in cols:
                cell = run.rows.get(runtime, {}).get(model.name, {}).get("batches", {}).get(batch, {})
                ms = cell.get("ms", {})
                if precision in ms:
                    cells.append(f"{ms[precision]:.3f} (×{ms[precision] / ms[LITERT_CPU]:.2f})")
                    base.append(ms[LITERT_CPU])
                else:
                    cells.append("")
            cells.append(f"{min(base):.3f}" if base else "")
            body.append(cells)
    return out + _table(["model", "batch", *[c[2] for c in cols], "LiteRT cpu (best)"], body) + \
        _footnotes(run, cols) + [""]


def creation_section(run: Run) -> list[str]:
    model = run.facts.get("creation model", "none")
    out = ["## Creation, cold and warm", "",
           f"Model {model}; seconds. Cold: every cache empty (LITEGPU_CACHE_DIR, NUMBA_CACHE_DIR, XDG_CACHE_HOME, "
           "POCL_CACHE_DIR, CUDA_CACHE_PATH in fresh folders); warm: a second process on the same folders. "
           "create = Interpreter (or CompiledModel) creation and allocation; first result = import to first "
           "output; num_threads=2.", ""]
    body = []
    for runtime, value in run.creation.items():
        if "cold" not in value:
            continue
        cells = [runtime]
        for kind in ("cold", "warm"):
            phases = value.get(kind, {})
            cells += [f"{phases[c]:.2f}" if c in phases else "not run" for c in ("create", "first result", "process")]
        body.append(cells)
    errors = [f"- {runtime}: {value['error']}" for runtime, value in run.creation.items() if "error" in value]
    if errors:
        out = out + ["Errors:", "", *errors, ""]
    if not body:
        return out + ["Nothing ran.", ""]
    header = ["runtime", "cold create", "cold first result", "cold process", "warm create", "warm first result",
              "warm process"]
    return out + _table(header, body) + [""]


def conformance_section(run: Run) -> list[str]:
    out = ["## Conformance suite", "", "`pytest --pyargs litegpu.testing.conformance_suite --litegpu-backend B "
           "--litegpu-precision P` (compares every case with LiteRT)" +
           (f", `-k {QUICK_CONFORMANCE if run.args.conformance_k is None else run.args.conformance_k}`"
            if run.args.quick or run.args.conformance_k else "") + ".", ""]
    body, details = [], []
    for backend in GPU_BACKENDS:
        for precision in ("f32", "f16"):
            s = run.conformance.get(f"{backend} {precision}")
            outcome = next((o for o in run.outcomes if o.part == f"conformance {backend} {precision.upper()}"), None)
            status = outcome.status if outcome else "not run"
            if s and "tests" in s:
                body.append([backend, precision.upper(), status, str(s["passed"]), str(s["failures"] + s["errors"]),
                             str(s["skipped"]), f"{s['seconds']:.0f}"])
                details += [f"- {backend} {precision.upper()} failed `{name}`: {msg}" for name, msg in s["failed"][:10]]
                details += [f"- {backend} {precision.upper()} skipped {n}×: {why}"
                            for why, n in list(s["skips"].items())[:3]]
            else:
                body.append([backend, precision.upper(), status, "", "", "", f"{s['seconds']:.0f}" if s else ""])
    labels = [f"- {label}" for label in (device_label(run, b) for b in GPU_BACKENDS) if label]
    return out + _table(["backend", "precision", "result", "passed", "failed", "skipped", "seconds"], body) + \
        ([""] + details if details else []) + ([""] + labels if labels else []) + [""]


def environment_section(run: Run) -> list[str]:
    out = ["## Machine and install", ""]
    rows = [[k, v] for k, v in run.facts.items() if k != "creation model"]
    out += _table(["", ""], rows) + ["", "litegpu backends:", ""]
    body = []
    for name, b in run.probe.get("backends", {}).items():
        device = b.get("device", {})
        what = ", ".join(str(device[k]) for k in ("device", "type", "driver") if k in device)
        body.append([name, "yes" if b["available"] else "no", (what if b["available"] else b["why"])[:200]])
    for name, why in run.probe.get("plugin_errors", {}).items():
        body.append([name, "no", f"plugin failed to load: {why}"[:200]])
    if not run.args.decoders:     # the decoders run has LiteRT-LM's GPU rows instead
        litert = run.litert_gpu[:200] or run.facts.get("WebGPU adapter", "")
        body.append(["LiteRT GPU", "no" if run.litert_gpu else "yes", litert])
    return out + _table(["backend", "usable", "device, or why not"], body) + [""]


def models_section(run: Run) -> list[str]:
    by_source = Counter(m.source for m in run.models)
    lines = [f"- {source}: {', '.join(m.name for m in run.models if m.source == source)}" for source in by_source]
    return ["## Models", "", f"{len(run.models)} models" + (" (--quick: one built model)" if run.args.quick else ""),
            "", *lines, ""]


def _tok_s(value: float | None) -> str:
    return "" if not value else f"{value:,.0f}"


def decoders_section(run: Run) -> list[str]:
    """Per bundle and runtime: agreement with LiteRT's answers, prefill and decode tokens/s,
    and decode against LiteRT-LM's GPU and CPU backends."""
    out = ["## Decoders against LiteRT-LM", ""]
    if not run.decoders:
        return out + ["No decoder bundle ran.", ""]
    out += _table(["bundle", "parameters", "prefill tokens", "decode tokens", "KV cache"],
                  [[c.name, f"{c.shape['params'] / 1e6:.1f}M", str(c.shape["prefill"]), str(c.shape["decode"]),
                    str(c.shape["cache"])] for c in run.decoders]) + [""]
    body = []
    for c in run.decoders:
        lm = {r: run.decoder_rows.get(r, {}).get(c.name, {}) for r in (LITERT_LM_GPU, LITERT_LM_CPU)}
        for runtime, rows in run.decoder_rows.items():
            row = rows.get(c.name, {})
            if "not_run" in row:
                continue
            if "error" in row:
                body.append([c.name, runtime, f"error: {row['error'][:160]}", "", "", "", "", ""])
                continue
            acc = row.get("accuracy")
            agree = f"{acc['agree']}/{acc['steps']}, {acc['max_abs']:.1e} ({acc['max_rel']:.1e} rel)" if acc else ""
            ratios = [f"{row['decode_tok_s'] / lm[r]['decode_tok_s']:.2f}" if lm[r].get("decode_tok_s") else ""
                      for r in (LITERT_LM_GPU, LITERT_LM_CPU)]
            label = device_label(run, runtime)
            body.append([c.name, runtime + (" (CPU device)" if label else ""), agree, f"{row.get('create_s', 0):.1f}",
                         _tok_s(row.get("prefill_tok_s")), _tok_s(row.get("decode_tok_s")), *ratios])
    out += _table(["bundle", "runtime", "greedy vs LiteRT, max logit err", "create s", "prefill tok/s",
                   "decode tok/s", "decode / LiteRT-LM GPU", "decode / LiteRT-LM CPU"], body)
    out += ["", "Each runtime in its own process, one after another, best of --rounds rounds after a warm "
                "one; LiteRT-LM's figures are its own benchmark's (litert_lm.Benchmark). Greedy: the steps "
                "that chose LiteRT's token, of those compared.", ""]
    steps = [f"- {name}, {runtime}: {step['launches']} launches, KV cache {step['kv_cache']}"
             + (f", CUDA graphs kept: {step['cuda_graphs']}" if "cuda_graphs" in step else "")
             for runtime, rows in run.decoder_rows.items() for name, row in rows.items()
             if (step := row.get("decode_step")) and step.get("launches")]
    return out + (["litegpu's decode step on its devices:", "", *steps, ""] if steps else [])


def not_run_section(run: Run) -> list[str]:
    """Every part, column, model and creation that did not run, grouped by reason."""
    items = list(run.not_run)
    for kind, table in (("models", run.rows), ("decoders", run.decoder_rows)):
        for runtime, rows in table.items():
            items += [(f"{kind} {runtime}: {name}", r["not_run"]) for name, r in rows.items() if "not_run" in r]
    for runtime, value in run.creation.items():
        if "not_run" in value:
            items.append((f"creation {runtime}", value["not_run"]))
        items += [(f"creation {runtime} {k}", v["not_run"]) for k, v in value.items()
                  if isinstance(v, dict) and "not_run" in v]
    for outcome in run.outcomes:
        if outcome.status == "partial":
            items.append((outcome.part, f"partly: {outcome.detail}"))
    by_reason: dict[str, list[str]] = {}
    for what, why in items:
        by_reason.setdefault(why, []).append(what)
    lines = [f"- {', '.join(whats)}: {why}" for why, whats in by_reason.items()]
    return ["## Not run", "", *(lines or ["Everything ran."]), ""]


def render(run: Run) -> str:
    counts = Counter(o.status for o in run.outcomes)
    verdict = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    mode = " (--quick)" if run.args.quick else ""
    head = [f"# litegpu GPU acceptance{' (--decoders)' if run.args.decoders else ''}{mode}", "",
            f"{datetime.datetime.now().isoformat(timespec='seconds')} on {platform.node()}: {verdict}; "
            f"{run.budget.used():.0f} s of a {run.args.budget:.0f} s budget.", ""]
    head += _table(["part", "result", "seconds", "detail"],
                   [[o.part, o.status, f"{o.seconds:.0f}", o.detail[:160]] for o in run.outcomes])
    if run.args.decoders:
        sections = [head + [""], environment_section(run), decoders_section(run), not_run_section(run)]
    else:
        sections = [head + [""], environment_section(run), models_section(run), conformance_section(run),
                    accuracy_section(run), timing_section(run), creation_section(run), not_run_section(run)]
    return "\n".join(line for section in sections for line in section)


def write_results(run: Run, out: Path, report: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    raw = {"facts": run.facts, "outcomes": [o.__dict__ for o in run.outcomes], "not_run": run.not_run,
           "probe": run.probe, "gpu": run.gpu, "litert_gpu": run.litert_gpu,
           "models": [{"name": m.name, "path": str(m.path), "source": m.source, "mb": m.mb} for m in run.models],
           "conformance": run.conformance, "rows": run.rows, "creation": run.creation,
           "decoders": [{"name": c.name, "path": str(c.path), "shape": c.shape} for c in run.decoders],
           "decoder_rows": run.decoder_rows,
           "options": {k: str(v) for k, v in vars(run.args).items()}}
    (out / "results.json").write_text(json.dumps(raw, indent=1, default=str))


def git_facts() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    if head.returncode:
        return "unknown (no git checkout here)"
    changed = len(dirty.stdout.splitlines())
    return head.stdout.strip() + (f" with {changed} changed or untracked files" if changed else "")


def acceptance(args: argparse.Namespace) -> int:
    """The whole run on this machine; the report goes to stdout and ``--out``."""
    budget = Budget(args.budget)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="litegpu-acceptance-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or workdir / "out")
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "acceptance.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logging.getLogger().addHandler(handler)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = Run(args, budget, workdir, env)
    run.facts.update({"Python": f"{platform.python_version()} ({sys.executable})", "commit": git_facts(),
                      "cores": f"{os.cpu_count()}; {args.threads} threads for litegpu cpu and LiteRT cpu"})
    try:
        install(run)
        environment(run)
        find_decoders(run) if args.decoders else find_models(run)
        execute(run)
    except Exception as exc:  # the report is the product: write what there is
        log.exception("the acceptance run broke")
        run.record(Outcome("gpu_acceptance.py", "failed", f"{type(exc).__name__}: {exc}"))
    report = render(run)
    write_results(run, out, report)
    print(report)
    log.info("report: %s; raw numbers: %s", out / "report.md", out / "results.json")
    if not args.keep_workdir and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


# -- --download: fill the wheelhouse here ---------------------------------------------------------------------
def wheel_pins(path: Path = WHEELS_FILE, run: str = "models") -> list[str]:
    """The ``name==version`` lines of the wheel list that ``run`` (``models`` or ``decoders``)
    carries: the untagged ones and those tagged ``[run]``."""
    pins = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        pin, _, tag = line.partition(" [")
        if pin and (not tag or tag.rstrip("]") == run):
            pins.append(pin.strip())
    return pins


def download_wheels(wheelhouse: Path, run: str = "models") -> list[str]:
    """pip download each pinned wheel for CPython 3.12 manylinux x86_64; drop any other file."""
    pins = wheel_pins(run=run)
    platforms = [arg for p in PIP_PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *platforms, "--disable-pip-version-check", "-d", str(wheelhouse), *pins]
    subprocess.run(cmd, check=True, timeout=900)
    wanted = {re.sub(r"[-_.]+", "-", p.split("==")[0]).lower(): p.split("==")[1] for p in pins}
    for wheel in wheelhouse.glob("*.whl"):
        name, version = _dist_name(wheel)
        if wanted.get(name) != version:
            log.info("removing %s: not in %s (one version per name)", wheel.name, WHEELS_FILE.name)
            wheel.unlink()
    return pins


def download_debs(folder: Path) -> str:
    """The Vulkan loader's .debs (amd64), as the device README fetches them; "" or why not."""
    folder.mkdir(parents=True, exist_ok=True)
    if not shutil.which("apt-get"):
        return "apt-get not found"
    res = subprocess.run(["apt-get", "download", *VULKAN_DEBS], cwd=folder, capture_output=True, text=True, timeout=300)
    if res.returncode:
        lists = Path(tempfile.gettempdir()) / "amd64"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        opts = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
        subprocess.run(["apt-get", *opts, "update"], capture_output=True, timeout=600)
        res = subprocess.run(["apt-get", *opts, "download", *VULKAN_DEBS], cwd=folder, capture_output=True,
                             text=True, timeout=300)
    return "" if res.returncode == 0 else f"apt-get download failed: {res.stderr.strip()[-300:]}"


def carry_models(folder: Path, budget_mb: float) -> list[str]:
    """Copy shared and fetched real models into ``folder`` in SMALL, REAL, LARGE order while
    they fit ``budget_mb``; notes on what was left behind."""
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "shared").mkdir(parents=True)
    (folder / "real").mkdir(parents=True)
    candidates = [("shared", n, SHARED_MODELS / f"{n}.tflite") for n in SMALL_SHARED]
    candidates += [("real", n, None) for n in REAL_CARRIED]
    candidates += [("shared", n, SHARED_MODELS / f"{n}.tflite") for n in LARGE_SHARED]
    used, notes = 0.0, []
    for kind, name, path in candidates:
        if path is None:
            try:
                from litegpu.testing.realmodels import fetch
                path = fetch(name)
            except Exception as exc:
                notes.append(f"real model {name} not carried: {exc}")
                continue
        if not path.exists():
            notes.append(f"{name} not carried: {path} does not exist")
            continue
        mb = path.stat().st_size / 1e6
        if used + mb > budget_mb:
            notes.append(f"{name} ({mb:.1f} MB) not carried: over the {budget_mb:g} MB model budget")
            continue
        shutil.copyfile(path, folder / kind / f"{name}.tflite")
        used += mb
    return notes


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tree_bytes() -> int:
    """What the device tool sends besides carried paths: tracked and untracked-not-ignored files."""
    res = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                         capture_output=True, timeout=60)
    return sum((REPO / p).stat().st_size for p in res.stdout.decode().split("\0") if p and (REPO / p).is_file())


def write_manifest(wheelhouse: Path) -> None:
    files = {p.relative_to(wheelhouse).as_posix(): {"bytes": p.stat().st_size,
                                                    "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(wheelhouse.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (wheelhouse / "manifest.json").write_text(json.dumps({"made": datetime.date.today().isoformat(),
                                                          "files": files}, indent=1))


def carry_decoders(folder: Path, tiny_dir: Path, large_dir: Path) -> list[str]:
    """The decoders part's bundles (acceptance_decoders.prepare): the tiny ones whole, the
    100M ones hollow, each with LiteRT's answers."""
    _sibling_modules()
    from acceptance_decoders import prepare
    shutil.rmtree(folder / "decoders", ignore_errors=True)
    wanted = [(f"tiny_{stem}", tiny_dir / f"{stem}.litertlm", False) for stem in CARRIED_DECODERS]
    wanted += [(f"100m_{stem}", large_dir / f"{stem}.litertlm", True) for stem in CARRIED_DECODERS
               if not stem.startswith("llama_f32")]   # float weights do not travel hollow: 400 MB
    missing = [str(path) for _, path, _ in wanted if not path.is_file()]
    notes = [f"missing (make them with benchmarks/export_decoders.py [--size small] --family llama --variant "
             f"f32 int8_dynamic int4_block32 --composites on --layout lm): {', '.join(missing)}"] if missing else []
    return notes + prepare(folder, [w for w in wanted if w[1].is_file()])


def download(args: argparse.Namespace) -> int:
    """Fill the wheelhouse and say whether it and the working tree fit what the device tool moves."""
    wheelhouse = Path(args.wheelhouse).resolve()
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pins = download_wheels(wheelhouse, "decoders" if args.decoders else "models")
    notes = [f"debs: {why}" for why in [download_debs(wheelhouse / "debs")] if why]
    if args.decoders:
        notes += carry_decoders(wheelhouse, Path(args.decoders_dir).expanduser(),
                                Path(args.decoders_dir).expanduser().with_name("decoders-small"))
    else:
        notes += carry_models(wheelhouse / "models", args.models_mb)
    write_manifest(wheelhouse)
    sizes = {"wheels": sum(p.stat().st_size for p in wheelhouse.glob("*.whl")),
             "debs": folder_bytes(wheelhouse / "debs"), "models": folder_bytes(wheelhouse / "models"),
             "decoders": folder_bytes(wheelhouse / "decoders"), "working tree": tree_bytes()}
    total = sum(sizes.values())
    print(f"wheelhouse {wheelhouse}: {len(pins)} wheels pinned in {WHEELS_FILE.name}")
    for what, size in sizes.items():
        print(f"  {what}: {size / 2**20:.1f} MiB")
    print(f"  total that travels: {total / 2**20:.1f} MiB of {CARRY_LIMIT / 2**20:.0f} MiB")
    for note in notes:
        print(f"  note: {note}")
    if total > CARRY_LIMIT * 0.95:
        print("  TOO BIG: the device tool refuses over 64 MiB (" +
              ("carry fewer decoders: CARRIED_DECODERS" if args.decoders else "lower --models-mb") + ")")
        return 1
    if args.decoders:
        print('then: run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_acceptance.py --decoders --wheelhouse '
              '.wheelhouse-lm --out $OUT --budget 240", carry=[".wheelhouse-lm"], timeout_s=300)')
    else:
        print('then: run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_acceptance.py --wheelhouse .wheelhouse '
              '--out $OUT", carry=[".wheelhouse"], timeout_s=600)')
    return 0


# -- command line ---------------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--download", action="store_true", help="fill the wheelhouse here (needs the network)")
    parser.add_argument("--decoders", action="store_true",
                        help="the decoders run (its own call and wheelhouse): litegpu's generation against "
                             "LiteRT-LM's on tiny and 100M bundles (benchmarks/acceptance_decoders.py)")
    parser.add_argument("--wheelhouse", help=f"carried wheels, debs and models (default {DEFAULT_WHEELHOUSE.name}, "
                                             f"--decoders {DECODERS_WHEELHOUSE.name})")
    parser.add_argument("--decoders-dir", default=str(Path.home() / ".cache" / "litegpu" / "decoders"),
                        help="--download --decoders: the tiny bundles (the 100M ones: its sibling decoders-small)")
    parser.add_argument("--litert-lm-python", help="the Python that runs LiteRT-LM's rows (default: this one)")
    parser.add_argument("--models-mb", type=float, default=31, help="--download: MB of models to carry")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for report.md, results.json, the log")
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one, removed at the end)")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one built model, a few conformance cases, few invokes")
    parser.add_argument("--budget", type=float, help=f"seconds for everything (default {DEFAULT_BUDGET_S}, "
                                                     f"--quick {QUICK_BUDGET_S})")
    parser.add_argument("--install", choices=("auto", "pip", "tree"), default="auto",
                        help="how to make litegpu importable when it is not installed from this tree")
    parser.add_argument("--models-dir", help="shared models folder (default: the wheelhouse's, else ../shared/models)")
    parser.add_argument("--models", help="comma-separated model names to run (default: all found)")
    parser.add_argument("--parts", help="comma-separated words: run only the parts whose name holds one "
                        "(e.g. 'webgpu,litert-gpu,models cuda'); install and environment always run")
    parser.add_argument("--conformance-k", help="pytest -k expression for the conformance runs")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--runs", type=int, help="most invokes per timed block (default 20, --quick 3)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3, --quick 2)")
    parser.add_argument("--block-s", type=float, help="longest timed block in seconds (default 0.5, --quick 0.1)")
    parser.add_argument("--per-model-s", type=float, help="a model (or a creation) that takes longer is stopped "
                                                          "(default 90, --quick 60)")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.wheelhouse is None:
        args.wheelhouse = str(DECODERS_WHEELHOUSE if args.decoders else DEFAULT_WHEELHOUSE)
    # A decoder on a cold backend compiles its prefill and decode signatures first.
    per_item = (150, 150) if args.decoders else (90, 60)
    for name, full, fast in (("budget", DEFAULT_BUDGET_S, QUICK_BUDGET_S), ("runs", 20, 3), ("rounds", 3, 2),
                             ("block_s", 0.5, 0.1), ("per_model_s", *per_item)):
        if getattr(args, name) is None:
            setattr(args, name, fast if quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse(argv)
    return download(args) if args.download else acceptance(args)


if __name__ == "__main__":
    sys.exit(main())
