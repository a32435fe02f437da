"""The fast backend: tensorized builders (``dartree.fast.builders``, registered as ``backend="fast"``)
and the hot operations with their Triton kernels and torch twins (``dartree.fast.ops``, the one
dispatch point).  See docs/kernels.md.
"""

from dartree.fast.ops import (
    KERNEL_BACKENDS,
    backend,
    depth_step,
    force_backend,
    greedy_walk,
    top_b,
    topk_candidates,
    tree_structure,
)
from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, TreeStructure

__all__ = ["KERNEL_BACKENDS", "CandidateSet", "DepthStep", "GreedyWalk", "TreeStructure", "backend", "depth_step",
           "force_backend", "greedy_walk", "top_b", "topk_candidates", "tree_structure"]
