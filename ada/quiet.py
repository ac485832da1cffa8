"""The quiet start every command shares, so a user sees ada's lines and real errors, not the
libraries' start-up noise: absl / orbax / JAX INFO records, libtpu's failed start on a
machine without a TPU (`E0000 ... TPU worker hostnames`, `Unable to initialize backend
'tpu'`), and the lines TensorFlow's native libraries print while they load (`Could not find
cuda drivers`, `All log messages before absl::InitializeLog()`), before any setting of theirs
applies. Each command's `main` calls `quiet_start()` once its arguments parse.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

NOISY_LOGGERS = ("absl", "jax", "orbax", "fsspec", "gcsfs", "tensorflow")
LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def quiet_logging() -> None:
    """ada's INFO records with a time stamp; every other logger's (JetStream logs its
    start-up on the root logger) from WARNING up only, even where a library lowers its own."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's own INFO lines
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    logging.getLogger("ada").setLevel(logging.INFO)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # a checkpoint write abandoned on a storage error (a full disk) leaves orbax's coroutine
    # unawaited at exit: the error is ada's one line, not this
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)


def quiet_start() -> None:
    """The logging above, and JAX on the CPU alone where no accelerator is present (no
    libtpu probe): call before JAX starts its backends."""
    quiet_logging()
    from ada import distributed

    distributed.cpu_only_without_accelerators()


@contextlib.contextmanager
def native_stderr_held() -> Iterator[None]:
    """Hold back what native code writes to file descriptor 2 inside the block (the import
    of a module that loads TensorFlow's libraries); it is shown if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
