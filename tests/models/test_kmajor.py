"""``dartree.models.kmajor.derived``: a cached derived tensor is rebuilt exactly when a source changes."""

from __future__ import annotations

import torch

from dartree.models.kmajor import derived


class Owner:
    pass


def test_derived_is_rebuilt_when_a_source_is_replaced_edited_moved_or_dropped():
    owner, builds = Owner(), []
    w, b = torch.ones(3), torch.zeros(3)

    def get(sources):
        def build():
            builds.append(1)
            return sum(x.sum() for x in sources if x is not None)
        return derived(owner, "slot", sources, build)

    first = get([w, b])
    assert get([w, b]) is first and len(builds) == 1                 # a hit: the same object
    w.mul_(2)                                                           # edited in place: its version
    assert float(get([w, b])) == 6.0 and len(builds) == 2
    w2 = w.clone()                                                      # replaced by an equal tensor
    get([w2, b])
    assert len(builds) == 3
    w2.set_(torch.full((3,), 5.0))                                      # the same tensor on new storage
    assert float(get([w2, b])) == 15.0 and len(builds) == 4
    get([w2, None])                                                     # a source dropped
    get([w2, None])
    assert len(builds) == 5
    get([w2, b])                                                        # and back
    get([w2])                                                           # fewer sources
    assert len(builds) == 7
