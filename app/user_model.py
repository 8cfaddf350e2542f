"""The explorer's side of user model files: uploads saved to disk; loading lives in the core
(`toast_core.targets`, shared with the `toast` CLI)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from toast_core.targets import (  # noqa: F401 - the app's import point for user files
    UserCodeError,
    UserFunction,
    file_digest,
    load_user_function,
    split_target,
    user_line,
    where,
)


def save_upload(name: str, data: bytes) -> str:
    """Writes an uploaded file under the temp dir (one folder per content hash); returns its path."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "toast_uploads" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (Path(name).name or "model.py")
    path.write_bytes(data)
    return str(path)
