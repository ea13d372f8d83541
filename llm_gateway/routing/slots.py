"""Which of an engine's slots holds which conversation, for engines that let a request ask for one.

llama-server keeps each slot's last prompt in that slot's KV cache; a request that lands on another slot
recomputes its whole prefix (unless `--cache-ram` had kept it). Without a slot asked for, the server picks the
idle slot whose last prompt is most similar (`--slot-prompt-similarity`, default 0.10) or else the least recently
used one; a request may instead name one (`id_slot`). A named slot that is busy does not go to another slot: the
task is deferred until that slot is free (ggml-org/llama.cpp `tools/server/server-context.cpp`,
`process_single_task`: `id_slot != -1 ? get_slot_by_id(id_slot) : get_available_slot(task)`, then
`if (slot->is_processing()) ... queue_tasks.defer`, read at fb4026604c67; the build setup_dev caches is
c6d8785425b4, whose behaviour tests/e2e checks). So the book names a slot only when it believes it idle:

- a conversation keeps the slot it was given, while that slot is not busy with one of the gateway's own requests;
- a new conversation (or one whose slot is busy) gets the idle slot used least recently, and keeps it;
- with no idle slot the request names none and the engine chooses.

The book knows only the gateway's own requests: another client's request can still take a slot it believes idle
(that request then waits for it, as the engine would have made it wait for any slot). The slots' count comes
from the engine's `/slots` (the adapter's probe), never from config, so a slot that does not exist is never
named. One book per deployment, on the deployment (routing/table.py); used by `cache_aware` routes whose
`affinity.engine_slots` is on.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_CONVERSATIONS = 8192  # conversations remembered per deployment


class SlotBook:
    __slots__ = ("busy", "held", "owner", "tick", "used")

    def __init__(self) -> None:
        self.held: OrderedDict[str, int] = OrderedDict()  # conversation -> its slot, least recent first
        self.owner: dict[int, str] = {}  # slot -> the conversation it was last given to
        self.used: dict[int, int] = {}  # slot -> `tick` when last given (higher: more recent)
        self.busy: dict[int, int] = {}  # slot -> the gateway's own requests on it now
        self.tick = 0

    def take(self, conversation: str, slots: int) -> int | None:
        """The slot to name for this conversation's request now (None: name none); marks it busy."""
        if slots <= 0:
            return None
        busy = self.busy
        slot = self.held.get(conversation)
        if slot is None or slot >= slots or busy.get(slot):
            idle = [s for s in range(slots) if not busy.get(s)]
            if not idle:
                return None
            used = self.used
            slot = min(idle, key=lambda s: used.get(s, -1))
            previous = self.owner.get(slot)
            if previous is not None and self.held.get(previous) == slot:  # its last conversation loses it
                del self.held[previous]
        self.owner[slot] = conversation
        self.held[conversation] = slot
        self.held.move_to_end(conversation)
        if len(self.held) > MAX_CONVERSATIONS:
            self.held.popitem(last=False)
        self.tick += 1
        self.used[slot] = self.tick
        busy[slot] = busy.get(slot, 0) + 1
        return slot

    def give_back(self, slot: int) -> None:
        """The request on `slot` ended."""
        n = self.busy.get(slot, 0) - 1
        if n > 0:
            self.busy[slot] = n
        else:
            self.busy.pop(slot, None)
