"""Which prompts each step trains on: a fresh seeded permutation per pass over the data.

The position (epoch, offset) is all the state there is, so a resumed run draws exactly the
prompts an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass
class PromptSampler:
    num_prompts: int
    seed: int
    epoch: int = 0
    offset: int = 0

    def _order(self) -> list[int]:
        order = list(range(self.num_prompts))
        random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def next_batch(self, batch_size: int) -> list[int]:
        """The next `batch_size` prompt indices, continuing into a new permutation when one ends."""
        indices: list[int] = []
        while len(indices) < batch_size:
            order = self._order()
            take = order[self.offset : self.offset + batch_size - len(indices)]
            indices.extend(take)
            self.offset += len(take)
            if self.offset == self.num_prompts:
                self.epoch, self.offset = self.epoch + 1, 0
        return indices

    def state(self) -> dict[str, int]:
        return asdict(self)
