"""Where the shared example models are: the one place that says so.

The shared ``.tflite`` models (``MODELS.md`` beside them lists how each was made) are
77 MB, so they live outside the repository: ``$LITEGPU_SHARED_MODELS`` when set, else
``../shared/models`` next to the checkout. The tests reach them only through the
``shared_model`` fixture (tests/conftest.py), which skips saying where it looked, or
fails where the run requires them (``LITEGPU_TEST_REQUIRE=models``); the mutation test,
the resize sweep and the fuzzer's corpus take their default directory from here.

The directory is read from the environment on every call, never at import, so a
subprocess or a test that sets ``LITEGPU_SHARED_MODELS`` sees its own value.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV", "NONE", "shared_models_dir", "shared_model_path", "shared_model_names", "why_missing"]

ENV = "LITEGPU_SHARED_MODELS"
# The parameter a test over "every shared model" gets where there are none, so that it
# skips (or fails) with the reason instead of pytest's bare "got empty parameter set".
NONE = "(no shared models)"


def shared_models_dir() -> Path:
    """``$LITEGPU_SHARED_MODELS``, else ``shared/models`` beside the checkout's folder."""
    where = os.environ.get(ENV)
    if where:
        return Path(where)
    # core/testing/shared_models.py -> the checkout -> its parent folder.
    return (Path(__file__).resolve().parents[2] / ".." / "shared" / "models").resolve()


def _file_name(name: str) -> str:
    return name if name.endswith(".tflite") else f"{name}.tflite"


def shared_model_path(name: str) -> Path:
    """The path of shared model ``name`` (``mobilenet_v2`` or ``mobilenet_v2.tflite``),
    whether or not it is there."""
    return shared_models_dir() / _file_name(name)


def shared_model_names() -> list[str]:
    """The file names of the shared models that are here, sorted; empty where there are none."""
    where = shared_models_dir()
    return sorted(p.name for p in where.glob("*.tflite")) if where.is_dir() else []


def why_missing(name: str = NONE) -> str:
    """Why shared model ``name`` cannot be read here (``NONE``: why there are none at all),
    or "" when it can."""
    where = shared_models_dir()
    if name == NONE:
        return "" if shared_model_names() else f"no shared models at {where} (set {ENV})"
    if shared_model_path(name).is_file():
        return ""
    return f"no shared model {_file_name(name)} at {where} (set {ENV})"
