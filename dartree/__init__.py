"""dartree: draft-tree speculative decoding with block-parallel drafters and correction heads."""

from dartree.block import CorrectionHead, DraftBlock
from dartree.builders import BUILDERS, TreeBuilder, make_builder, register_builder
from dartree.select import best_first_select, top_b_select
from dartree.tree import DraftTree

__all__ = ["BUILDERS", "CorrectionHead", "DraftBlock", "DraftTree", "TreeBuilder", "best_first_select",
           "make_builder", "register_builder", "top_b_select"]
