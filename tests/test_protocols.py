"""dartree.protocols: the checks every entry point makes of a user's drafter and sampler, the optional head
methods, and the protocols' old import paths."""

from __future__ import annotations

import pytest
import torch

from dartree import make_builder
from dartree.batch_drafters import RowsOfDrafters, batch_drafter
from dartree.decode import SpeculativeDecoder
from dartree.protocols import (
    DRAFTER_MEMBERS,
    OPTIONAL_HEAD_METHODS,
    check_drafter,
    check_sampler,
    head_method,
    is_batch_drafter,
)
from dartree.testing import OracleDrafter
from dartree.testing.heads import PathHashHead
from dartree.verify import KeyedSampler, verify_sampled
from tests.test_decode import GAMMA, model_for
from tests.verify.helpers import make_tree


@pytest.mark.parametrize("missing", DRAFTER_MEMBERS)
def test_a_drafter_missing_a_member_is_named_at_every_entry(missing):
    model = model_for("llama", "sdpa")
    drafter = OracleDrafter(model, GAMMA)

    class Partial:
        pass

    partial = Partial()
    for member in DRAFTER_MEMBERS:
        if member != missing:
            setattr(partial, member, getattr(drafter, member))
    with pytest.raises(ValueError, match=rf"^drafter: missing '{missing}'"):
        check_drafter(partial)
    with pytest.raises(ValueError, match=rf"^drafter: missing '{missing}'"):
        SpeculativeDecoder(model, partial, make_builder("chain"))
    with pytest.raises(ValueError, match=rf"^drafter: missing '{missing}'"):
        RowsOfDrafters(partial)
    check_drafter(drafter)
    assert not is_batch_drafter(drafter) and is_batch_drafter(batch_drafter(drafter))


def test_a_sampler_needs_a_callable_sample():
    class NotCallable:
        sample = 3

    tree = make_tree([([3, 1, 2], [-1, 0, 0])])
    for bad in (object(), NotCallable()):
        with pytest.raises(ValueError, match=r"^sampler: expected an object with sample\(logits, positions\)"):
            check_sampler(bad)
        with pytest.raises(ValueError, match=r"^sampler:"):
            verify_sampled(tree, torch.randn(1, 3, 7), 1.0, bad)
    check_sampler(KeyedSampler(0))


def test_optional_head_methods_are_looked_up_by_name():
    class Plain:
        pass

    head = PathHashHead()
    for method in OPTIONAL_HEAD_METHODS:
        assert head_method(Plain(), method) is None
        found = head_method(head, method)
        assert found is None or callable(found)
    with pytest.raises(ValueError, match=r"^method: expected one of"):
        head_method(head, "advance")


def test_the_protocols_old_import_paths_are_the_same_classes():
    import dartree.protocols as p
    from dartree.batch_drafters import BatchDrafter
    from dartree.decode import Drafter
    from dartree.protocols import CorrectionHead
    from dartree.verify.sampling import Sampler
    assert (Drafter, BatchDrafter, CorrectionHead, Sampler) == (p.Drafter, p.BatchDrafter, p.CorrectionHead,
                                                                 p.Sampler)
