"""The one error type a user sees, on either side (sim and profiler): a field or flag name and a
reason, printed as one line with exit code 2."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable


class InputError(ValueError):
    """Bad input. str(error) is the whole message: `field: reason`."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)

    def __reduce__(self):
        # Rebuilt from (field, reason) when it crosses a process boundary (a sweep's workers).
        return type(self), (self.field, self.reason)


def exit_code(command: Callable[[], int]) -> int:
    """Run a command-line command: its own exit code, or 2 with bad input's one line on stderr
    (1, silently, where the reader of its output, `head` say, closed the pipe)."""
    try:
        return command()
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # What is left to print goes nowhere, so that the interpreter's last flush at exit does not
        # fail a second time (Python's documented handling of SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
