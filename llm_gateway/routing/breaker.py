"""A circuit breaker per deployment: passive outlier detection from real traffic.

Closed: traffic flows and consecutive failures are counted. After `failures` of them in a row the
breaker opens: the deployment gets no traffic for `cooldown_s`. Then it is half-open: exactly one
trial request goes through; its success closes the breaker, its failure opens it again.
Only failures that are the backend's count (connection errors, 5xx, timeouts); a busy engine
(queue full) or a client error is not a failure.
"""

from __future__ import annotations

from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]
STATE_VALUE: dict[str, int] = {"closed": 0, "half_open": 1, "open": 2}


class Breaker:
    __slots__ = ("cooldown_s", "failures", "opened_at", "state", "threshold", "trial_in_flight")

    def __init__(self, threshold: int, cooldown_s: float) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.state: BreakerState = "closed"
        self.failures = 0
        self.opened_at = 0.0
        self.trial_in_flight = False

    def available(self, now: float) -> bool:
        """Could a request go here now? (Does not take the half-open trial.)"""
        if self.state == "closed":
            return True
        if self.state == "open":
            return now - self.opened_at >= self.cooldown_s
        return not self.trial_in_flight

    def acquire(self, now: float) -> bool:
        """Take permission for one request; in half-open state only one at a time gets it."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now - self.opened_at < self.cooldown_s:
                return False
            self.state = "half_open"
            self.trial_in_flight = False
        if self.trial_in_flight:
            return False
        self.trial_in_flight = True
        return True

    def success(self) -> None:
        self.state = "closed"
        self.failures = 0
        self.trial_in_flight = False

    def failure(self, now: float) -> None:
        self.failures += 1
        if self.state == "half_open" or self.failures >= self.threshold:
            self.state = "open"
            self.opened_at = now
        self.trial_in_flight = False

    def neutral(self) -> None:
        """The request ended in a way that says nothing about the backend (client error, cancel)."""
        self.trial_in_flight = False
