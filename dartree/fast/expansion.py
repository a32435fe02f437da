"""What the last depth-wise fast build expanded: the head work that ``dartree-pruned``'s bound saved.

Every depth-wise fast build records one :class:`Expansion` for the calling thread (:func:`last`).  A depth is
one evaluation of the head's logits for all branches of all rows, so ``depths_saved`` is the number of head
calls the bound saved::

    tree = builder.build(block, head)
    saved = dartree.fast.expansion.last().depths_saved
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Expansion", "last", "record"]


@dataclass(frozen=True)
class Expansion:
    """One build's expansion.

    depths: depths whose branches the head scored (head logits evaluations).
    full_depths: the depths Algorithm 1 scores without the bound (the width schedule's length).
    branches: branch rows the head scored, summed over depths and rows (a batch's padding included).
    full_branches: the same without the bound.
    """

    depths: int
    full_depths: int
    branches: int
    full_branches: int

    @property
    def depths_saved(self) -> int:
        return self.full_depths - self.depths


_local = threading.local()


def record(expansion: Expansion) -> None:
    """Store ``expansion`` as the calling thread's last build."""
    _local.last = expansion


def last() -> Expansion | None:
    """The calling thread's last depth-wise fast build, or None before the first."""
    return getattr(_local, "last", None)
