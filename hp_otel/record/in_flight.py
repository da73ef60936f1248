"""The collectives a window issued that have not completed: what a hang watchdog writes."""

from __future__ import annotations

from collections.abc import Callable

from hp_otel.record.events import CollectiveIssue

_MAX_IN_FLIGHT = 4096  # beyond, the oldest (work nobody waits for) is forgotten


class InFlight:
    """Issued collectives, oldest first, until they return (or, with a done-probe, until their work is
    done). The training thread adds and removes; the watchdog's thread reads and forgets completed ones:
    every step is one dict operation, safe under the GIL (implements `watchdog.InFlightCollectives`)."""

    __slots__ = ("_issues",)

    def __init__(self) -> None:
        self._issues: dict[CollectiveIssue, None] = {}

    def __len__(self) -> int:
        return len(self._issues)

    def add(self, issue: CollectiveIssue) -> None:
        issues = self._issues
        if len(issues) >= _MAX_IN_FLIGHT:
            issues.pop(next(iter(issues)), None)
        issues[issue] = None

    def returned(self, issue: CollectiveIssue, done: Callable[[], bool] | None, failed: bool) -> None:
        """Its call returned: in flight until `done()` says its work is done (without a probe, or failed: no more)."""
        issue.returned = True
        if done is not None and not failed:
            issue.pending = done
        else:
            self._issues.pop(issue, None)

    def forget_completed(self) -> None:
        """Drop returned collectives whose work is done (the watchdog's thread calls this)."""
        for issue in self.in_flight():
            pending = issue.pending
            if issue.returned and pending is not None:
                try:
                    done = pending()
                except Exception:  # a handle that cannot say: it returned, count it done
                    done = True
                if done:
                    self._issues.pop(issue, None)

    def in_flight(self) -> list[CollectiveIssue]:
        """Collectives issued that have not completed, oldest first (any thread may ask)."""
        return list(dict(self._issues))  # one C-level copy: safe while the training thread adds and removes

    def clear(self) -> None:
        self._issues.clear()
