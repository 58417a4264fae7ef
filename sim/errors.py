"""The one error type a user sees: a field name and a reason, printed as one line."""
from __future__ import annotations


class ScenarioError(ValueError):
    """Bad input. str(error) is the whole message: `field: reason`."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)

    def __reduce__(self):
        # Rebuilt from (field, reason) when it crosses a process boundary (a sweep's workers).
        return type(self), (self.field, self.reason)
