"""Where numba keeps the compiled CPU kernels, for a user who can write neither the install nor HOME.

numba caches a kernel beside its source (``__pycache__``), else under ``~/.cache/numba``; where it can write
neither (a read-only install run by a user without a writable HOME) it refuses to compile at all, and even
``bigknn info`` fails. Then, unless NUMBA_CACHE_DIR is set, a private directory under the system's temporary
directory is used (created 0700 and owned by this user; never one another user made or a link).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def choose(env: dict[str, str], writable=lambda p: os.access(p, os.W_OK)) -> str | None:
    """The NUMBA_CACHE_DIR to set, or None where numba's own places will do (or the user chose one)."""
    if env.get("NUMBA_CACHE_DIR"):
        return None
    if writable(PACKAGE / "backends" / "cpu"):
        return None
    user_cache = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "/nonexistent") / ".cache")
    if any(writable(p) for p in (user_cache, *user_cache.parents) if p.exists()):
        return None
    return private_dir()


def private_dir() -> str:
    """``<tmp>/bigknn-numba-<uid>``, made 0700 if missing; a fresh one when that name is not ours (a link,
    another user's)."""
    path = Path(tempfile.gettempdir()) / f"bigknn-numba-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="bigknn-numba-")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return tempfile.mkdtemp(prefix="bigknn-numba-")
    return str(path)


def ensure() -> None:
    """Set NUMBA_CACHE_DIR where needed; before numba is imported."""
    chosen = choose(dict(os.environ))
    if chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = chosen
