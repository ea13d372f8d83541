"""What a translation made for the last few distinct inputs, found again by the input's bytes.

A coding agent resends the same 20-odd tool schemas and system prompt on every turn; translating or encoding
them again each time was a large part of what /v1/messages and /v1/responses cost over chat completions
(issue 36 item 2). `Recent` keeps what was made for the last few distinct keys (the input's JSON bytes, or its
text): equal bytes are equal values, types included (1 and 1.0 differ), so a hit is exactly what making it again
would give. Keys are compared by length first, then contents (one memcmp), not hashed: a key is tens of KB and a
new object on every request, whose hash would be computed each time. The few entries are scanned newest first.
What is kept must never be changed by its users.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Recent(Generic[T]):
    """The values kept for the last `size` distinct keys, the newest last; a key found moves to the end."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: list[tuple[str | bytes, T]] = []

    def find(self, key: str | bytes) -> T | None:
        """The value kept under a key equal to `key`, or None."""
        entries = self._entries
        n = len(key)
        for i in range(len(entries) - 1, -1, -1):
            k, value = entries[i]
            if len(k) == n and k == key:
                if i != len(entries) - 1:
                    entries.append(entries.pop(i))
                return value
        return None

    def keep(self, key: str | bytes, value: T) -> T:
        """Keep `value` under `key` (the oldest goes beyond `size`); gives `value` back."""
        entries = self._entries
        entries.append((key, value))
        if len(entries) > self.size:
            del entries[0]
        return value

    def clear(self) -> None:
        self._entries.clear()
