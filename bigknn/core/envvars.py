"""The environment variables bigknn reads, each checked where it is read: a bad value stops the command with one
line naming the variable (exit 2), never a raw ValueError far from the cause or a writer thread's traceback."""

from __future__ import annotations

import math
import os

from bigknn.core.errors import BadInput


def seconds(name: str, default: float) -> float:
    """A duration in seconds from ``name`` (unset or empty: ``default``): a finite number >= 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise BadInput(f"environment variable {name}={raw!r}", "expected a finite number of seconds >= 0")
    return value


def integer(name: str) -> int | None:
    """An integer from ``name``; None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadInput(f"environment variable {name}={raw!r}", "expected an integer") from None


def flag(name: str, default: bool) -> bool:
    """A switch from ``name``: 1/0 (also true/false, yes/no, on/off); unset or empty: ``default``."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise BadInput(f"environment variable {name}={raw!r}", "expected 1 or 0")


# every variable bigknn reads and the check of its kind; checked at the CLI's start (check_all), so a bad value
# is refused before any work, not when a writer thread first reads it
KINDS = {"BIGKNN_CHECKPOINT_S": lambda n: seconds(n, 0.0), "BIGKNN_LOG_EVERY_S": lambda n: seconds(n, 0.0),
         "BIGKNN_CUDA_EXPAND": lambda n: flag(n, True), "BIGKNN_CUDA_MMA": lambda n: flag(n, True),
         "BIGKNN_CUDA_CHECK": lambda n: flag(n, False), "BIGKNN_CUDA_GUNR": integer, "BIGKNN_CUDA_MODE": integer}


def check_all() -> None:
    """Refuse (exit 2, naming it) the first variable of ``KINDS`` set to a value of the wrong kind."""
    for name, check in KINDS.items():
        check(name)
