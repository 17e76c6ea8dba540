"""litegpu's environment variables, read in one place and strictly.

A switch that is misspelled must not quietly mean "off": ``LITEGPU_OPENCL_FORBID_COMPILE=enabled``
reading as false would turn the check it exists for into a pass. So a flag accepts the usual
spellings and anything else is an :class:`InvalidArgumentError` naming the variable.
"""
from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

from .errors import InvalidArgumentError

CACHE_DIR = "LITEGPU_CACHE_DIR"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str, default: bool) -> bool:
    """The boolean environment variable ``name`` (``default`` when unset or blank)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InvalidArgumentError(f"{name}={os.environ[name]!r} is not a switch; use one of "
                               f"{', '.join(_TRUE)} or {', '.join(_FALSE)}")


def cache_root() -> Path:
    """The root of every litegpu cache: ``$LITEGPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/litegpu``,
    else ``~/.cache/litegpu``. Each user of it (kernels, programs, fetched models) takes a subfolder."""
    root = os.environ.get(CACHE_DIR)
    if root:
        return Path(os.path.expanduser(root))
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "litegpu"


def install_hint(extra: str) -> str:
    """The pip command that installs litegpu's optional ``extra``: its packages by name, read
    from the installed metadata, so the hint works whether litegpu came from a wheel or a
    clone (``pip install 'litegpu[cuda]'`` needs litegpu on an index)."""
    marker = re.compile(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""")
    try:
        wanted = [r.split(";")[0].strip() for r in metadata.requires("litegpu") or () if marker.search(r)]
    except metadata.PackageNotFoundError:
        wanted = []
    if not wanted:
        return f"pip install 'litegpu[{extra}]'"
    return "pip install " + " ".join(f"'{w}'" for w in wanted) + f" (litegpu's [{extra}] extra)"
