"""The one error type a user sees, on either side (sim and profiler): a field or flag name and a
reason, printed as one line with exit code 2."""
from __future__ import annotations

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
    """Run a command-line command: its own exit code, or 2 with bad input's one line on stderr."""
    try:
        return command()
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
