"""Publishing a folder written elsewhere: a reader sees the old folder or the new, whole one."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def replace_dir(staging: Path, final: Path) -> Path:
    """Put the complete folder ``staging`` at ``final``, replacing any folder there.

    The old folder is renamed aside, the new one renamed in, then the old one deleted: two
    renames rather than an ``rmtree`` first, so a crash at any point leaves the old folder
    (under one of its two names) or the new one, never neither and never a half-deleted one;
    when the new folder cannot go in, the old one is put back.
    ``staging`` must be on the same file system as ``final`` (a sibling, in practice).
    """
    staging, final = Path(staging), Path(final)
    retired = None
    if final.exists():
        retired = final.with_name(f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        final.rename(retired)
    try:
        staging.rename(final)
    except OSError:
        if retired is not None and not final.exists():
            retired.rename(final)  # the new folder could not go in: the old one goes back
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
    return final
