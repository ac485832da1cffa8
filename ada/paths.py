"""The one path layer of run folders: local paths and gs:// (etils epath, as orbax uses).

Checkpoints, run folders (config.json, metrics.jsonl, summary, plots, TensorBoard events),
the warm-start cache and exports go through `path()`, so `--workdir gs://bucket/run` works
wherever a local folder does. Two differences of object storage are handled here:

- no rename: `write_atomic` writes a local file through a temporary name and os.replace, and
  an object in one request (a reader sees the old object or the whole new one);
- no append: `append_text` appends to a local file and rewrites an object whole.

gs:// goes through fsspec (gcsfs) whether TensorFlow is installed or not (epath would pick
tf.io.gfile when it is), so a TPU VM without TensorFlow and the tests behave the same. A GCS
emulator is reached through its endpoint settings (STORAGE_EMULATOR_HOST for gcsfs and
google-cloud-storage, TENSORSTORE_GCS_HTTP_URL for orbax's array writes).
"""

from __future__ import annotations

import errno
import os
import tempfile

os.environ.setdefault("EPATH_USE_TF", "false")  # read by epath once, on its first gs:// call

import fsspec  # noqa: E402
from etils import epath  # noqa: E402

# Other processes of a run, and orbax's tensorstore writes, add objects that a cached listing
# would not show: list gs:// afresh every time (a checkpoints folder holds a few steps).
fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)
REMOTE_PREFIXES = ("gs://",)


def is_remote(p) -> bool:
    """True for an object-store path (gs://), where renames are copies."""
    return str(p).startswith(REMOTE_PREFIXES)


def path(p) -> epath.Path:
    """`p` as an epath.Path: gs:// as it is, a local path made absolute."""
    return epath.Path(p if is_remote(p) else os.path.abspath(os.fspath(p)))


def join(p, *parts: str) -> str:
    """`p / parts` as a string (what messages and orbax take)."""
    return str(path(p).joinpath(*parts))


def read_bytes(p) -> bytes:
    """A whole file. On gs:// one GET, so an object that is rewritten meanwhile (a live run's
    metrics.jsonl) is read whole, old or new; fsspec's ranged read-ahead can wait forever
    for bytes of the old one."""
    p = path(p)
    return fsspec.filesystem("gcs").cat_file(str(p)) if is_remote(p) else p.read_bytes()


def write_atomic(p, data: str | bytes) -> None:
    """Write a whole file so that a reader never sees half of it."""
    p, data = path(p), data.encode("utf-8") if isinstance(data, str) else data
    if is_remote(p):
        p.write_bytes(data)
        return
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, p)


def append_text(p, text: str) -> None:
    """Append to a file (an object is rewritten whole: object stores cannot append)."""
    p = path(p)
    if is_remote(p):
        old = read_bytes(p).decode("utf-8") if p.exists() else ""
        p.write_text(old + text)
        return
    with open(p, "a", encoding="utf-8") as f:
        f.write(text)


def workdir_problem(workdir: str) -> str | None:
    """Why `workdir` cannot be a run's output directory (one line), or None. A local one must
    exist or be creatable and be writable; a directory made to find out is removed again, so
    a run that stops before writing leaves nothing behind. On gs:// a probe object is written
    and deleted."""
    if is_remote(workdir):
        probe = path(workdir) / f".write_test{os.getpid()}"
        try:
            probe.write_text("")
            probe.unlink()
        except Exception as e:  # noqa: BLE001 - gcsfs / google-auth raise many kinds
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            return (f"output directory {workdir!r} is not writable ({first}); check the bucket, "
                    "its permissions and your credentials, or pick another --workdir")
        return None
    local = os.path.abspath(workdir)
    probe = local
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(local) and not os.path.isdir(local):
        return f"output directory {workdir!r} exists and is not a directory; pick another --workdir"
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "EROFS, a read-only file system" if os.statvfs(probe).f_flag & os.ST_RDONLY else \
            "EACCES"
        return (f"output directory {workdir!r} is not writable ({probe} denies writes: {why}); "
                "pick another --workdir or fix its permissions")
    try:  # try it now so the error comes before any compile
        os.makedirs(local, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=local, prefix=".write_test"):
            pass
    except OSError as e:
        return (f"output directory {workdir!r} is not writable ({e.strerror}, "
                f"{errno.errorcode.get(e.errno, e.errno)}); pick another --workdir or fix its "
                "permissions or space")
    finally:
        while local != probe and os.path.isdir(local) and not os.listdir(local):
            os.rmdir(local)  # made here (probe was the deepest that existed)
            local = os.path.dirname(local)
    return None
