"""The exit codes of the ``radixchat`` command, defined once for the CLI, batch mode and the app."""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # batch mode: some conversation failed, or the output could not be written
    USAGE = 2  # a usage or configuration error (bad flag, bad config file, unreadable input)
    MODEL = 3  # the model failed to load, or the remote server cannot be used
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


def signal_exit_code(signum: int) -> int:
    """The shell's convention for a run stopped by a signal: 130 for Ctrl-C, 143 for SIGTERM."""
    return ExitCode.INTERRUPTED if signum == signal.SIGINT else 128 + signum
