"""Build and print one tree per strategy on a random block (the foundation's quick demo).

    python examples/build_trees.py
"""

import torch

from dartree import BUILDERS, DraftBlock, make_builder
from dartree.testing import PathHashHead

torch.manual_seed(0)
block = DraftBlock(logits=torch.randn(1, 6, 50) * 2, root=torch.tensor([7]))
head = PathHashHead(strength=1.0)
configs = {"chain": {}, "corrected-chain": {"topk": 8}, "dartree-pruned": {"budget": 12, "width": 4, "topk": 8}}
for name in BUILDERS:
    builder = make_builder(name, backend="ref", **configs.get(name, {"budget": 12, "topk": 8}))
    tree = builder.build(block, head if builder.needs_head else None)
    print(f"\n{name} ({builder.config}): {int(tree.num_nodes[0]) - 1} draft nodes")
    print(tree.format(0))
