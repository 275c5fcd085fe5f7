"""A model directory derived from a file once (a GGUF converted or packed), written atomically.

The directory is built in a temporary sibling and moved into place whole: a crash, Ctrl-C or a full disk
leaves no half-written model, and two processes converting the same file at once both end with one good copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from radixchat.errors import ModelLoadError


def file_key(path: Path, salt: str = "") -> str:
    """A short key of a file's identity (path, size, modification time), plus ``salt``."""
    st = path.stat()
    return hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}{salt}".encode()).hexdigest()[:12]


def build_once(
    target: Path,
    write: Callable[[Path], None],
    ready: Callable[[Path], bool],
    *,
    source: Path,
    verb: str,
    doing: str,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Return ``target``, first building it with ``write(tmp_dir)`` unless ``ready(target)``, saying ``doing``
    before and ``<verb>ed in N s`` after. A failure is one ModelLoadError line (``cannot <verb> <source>:
    why``) and leaves nothing behind."""
    if ready(target):
        return target
    say = progress or (lambda msg: print(f"radixchat: {msg}", file=sys.stderr, flush=True))
    say(doing)
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(tmp)
        if target.exists() and not ready(target):
            shutil.rmtree(target, ignore_errors=True)  # a stale one (another CPU's layout, an older version)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same work first
            if not ready(target):
                raise
    except ModelLoadError:
        raise
    except Exception as exc:
        reason = str(exc).splitlines()[0][:300] if str(exc).strip() else repr(exc)
        raise ModelLoadError(f"cannot {verb} {source}: {reason}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"{verb}ed in {time.perf_counter() - started:.1f} s -> {target}")
    return target
