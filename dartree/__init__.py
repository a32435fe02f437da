"""dartree: draft-tree speculative decoding with block-parallel drafters and correction heads.

The public names load on first use (PEP 562), so that ``import dartree`` (and the ``dartree`` command's
``--help``) does not import torch and transformers until something needs them.  ``dartree.BUILDERS`` is read
anew at every access: every registered strategy, the built-in ones and any registered since.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_EXPORTS = {
    "CorrectionHead": "dartree.protocols", "DraftBlock": "dartree.block",
    "BUILDERS": "dartree.builders", "TreeBuilder": "dartree.builders", "make_builder": "dartree.builders",
    "register_builder": "dartree.builders",
    "GenerationResult": "dartree.decode", "RoundStats": "dartree.decode", "SpeculativeDecoder": "dartree.decode",
    "generate_ar": "dartree.decode",
    "best_first_select": "dartree.select", "top_b_select": "dartree.select",
    "DraftTree": "dartree.tree",
    "GeneratorSampler": "dartree.verify", "KeyedSampler": "dartree.verify", "Sampling": "dartree.sampling_options",
}

__all__ = ["BUILDERS", "CorrectionHead", "DraftBlock", "DraftTree", "GenerationResult", "GeneratorSampler",
           "KeyedSampler", "RoundStats", "Sampling", "SpeculativeDecoder", "TreeBuilder", "best_first_select",
           "generate_ar", "make_builder", "register_builder", "top_b_select"]

if TYPE_CHECKING:
    from dartree.block import DraftBlock
    from dartree.builders import BUILDERS, TreeBuilder, make_builder, register_builder
    from dartree.decode import GenerationResult, RoundStats, SpeculativeDecoder, generate_ar
    from dartree.protocols import CorrectionHead
    from dartree.sampling_options import Sampling
    from dartree.select import best_first_select, top_b_select
    from dartree.tree import DraftTree
    from dartree.verify import GeneratorSampler, KeyedSampler


def __getattr__(name: str) -> Any:
    if name == "BUILDERS":                     # live: every strategy registered so far, built-in or not
        return importlib.import_module("dartree.builders").registered()
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dartree' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value                    # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
