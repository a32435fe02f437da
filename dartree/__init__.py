"""dartree: draft-tree speculative decoding with block-parallel drafters and correction heads."""

from dartree.block import CorrectionHead, DraftBlock
from dartree.tree import DraftTree

__all__ = ["CorrectionHead", "DraftBlock", "DraftTree"]
