"""dartree: draft-tree speculative decoding with block-parallel drafters and correction heads."""

from dartree.block import CorrectionHead, DraftBlock
from dartree.builders import BUILDERS, TreeBuilder, make_builder, register_builder
from dartree.decode import GenerationResult, RoundStats, SpeculativeDecoder, generate_ar
from dartree.select import best_first_select, top_b_select
from dartree.tree import DraftTree
from dartree.verify import GeneratorSampler, KeyedSampler

__all__ = ["BUILDERS", "CorrectionHead", "DraftBlock", "DraftTree", "GenerationResult", "GeneratorSampler",
           "KeyedSampler", "RoundStats", "SpeculativeDecoder", "TreeBuilder", "best_first_select", "generate_ar",
           "make_builder", "register_builder", "top_b_select"]
