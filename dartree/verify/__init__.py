"""Tree verification: target inputs and masks, greedy / sampled acceptance, samplers, KV compaction."""

from dartree.verify.accept import (
    VerifyResult,
    accept_picks,
    verify_greedy,
    verify_sampled,
    walk_greedy,
    walk_sampled,
)
from dartree.verify.cache import compact_tail
from dartree.verify.inputs import ATTENTION_IMPLEMENTATIONS, TreeInputBuffer, TreeInputs, tree_inputs
from dartree.verify.rejection import SampledTree, sample_tree, verify_rejection
from dartree.verify.sampling import GeneratorSampler, KeyedSampler, Sampler, hash32
from dartree.verify.traversal import verify_traversal
from dartree.verify.warp import Warp

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "GeneratorSampler",
    "KeyedSampler",
    "SampledTree",
    "Sampler",
    "TreeInputBuffer",
    "TreeInputs",
    "VerifyResult",
    "Warp",
    "accept_picks",
    "compact_tail",
    "hash32",
    "sample_tree",
    "tree_inputs",
    "verify_greedy",
    "verify_rejection",
    "verify_sampled",
    "verify_traversal",
    "walk_greedy",
    "walk_sampled",
]
