"""The user error every layer raises, and the one way a command line reports it. A leaf:
it imports nothing from ada, so any module (meshes, data, sampling) can raise it without
climbing to the config."""

from __future__ import annotations

import sys


class ConfigError(ValueError):
    """A bad config, override or path; its message is one line meant for the user."""


def fail(e: Exception) -> int:
    """The one way a command line reports a user error: one line on stderr, exit code 2."""
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
