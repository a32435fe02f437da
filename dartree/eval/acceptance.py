"""The accepted-rank histogram of a decoder's rejection rounds (Sequoia's ``acceptance`` for a model pair), from
the decoder's own engine stages (``docs/builders.md``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dartree.rounds import check_request
from dartree.sequoia import MIN_TESTS, acceptance_from_walks
from dartree.tree import PAD, children_lists
from dartree.verify.rejection import SampledTree

__all__ = ["measure_acceptance"]


def measure_acceptance(decoder, prompts: Sequence, max_new_tokens: int = 64, temperature: float = 1.0,
                       sampler=None, min_tests: int = MIN_TESTS, ranks: int = 8, **warp) -> tuple[float, ...]:
    """The accepted-rank histogram ``P_r`` of ``decoder``'s rejection decodes of ``prompts`` (Sequoia's
    ``acceptance`` for this model pair, temperature and warp).  ``decoder``'s trees should give nodes ``ranks``
    children or more (e.g. ``corrected-sequoia`` with ``acceptance=(0.12,) * 8``).

    Shape: prompts: integer ``[L]`` or ``[1, L]`` tensors.
    """
    walks: list[tuple[int, int | None]] = []
    with torch.inference_mode():
        for prompt in prompts:
            req = check_request(decoder.target, prompt, max_new_tokens, temperature, sampler, verifier="rejection",
                                **warp)
            engine = decoder.engine(req, single=True)
            engine.admit([req])
            while engine.live:
                engine.clock.lap()
                drafted = engine.build(engine.draft())
                verified = engine.verify(drafted)
                if isinstance(drafted, SampledTree):
                    walks += _walk(drafted.tree.parents[0].tolist(), int(drafted.tree.num_nodes[0]),
                                   [u for u in verified.result.accepted[0].tolist() if u != PAD])
                engine.commit(verified)
    return acceptance_from_walks(walks, min_tests, ranks)


def _walk(parents: list[int], count: int, path: list[int]) -> list[tuple[int, int | None]]:
    """One round's ``(children, accepted rank or None)`` per visited node with children (``path``: the
    accepted nodes, root first; children in node order are the draw order)."""
    kids = children_lists(parents, count)
    out: list[tuple[int, int | None]] = []
    for j, u in enumerate(path):
        if kids[u]:
            nxt = path[j + 1] if j + 1 < len(path) else None
            out.append((len(kids[u]), None if nxt is None else kids[u].index(nxt)))
    return out
