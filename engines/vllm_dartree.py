"""dartree's proposer inside vLLM: ``speculative_config={"model": "engines.vllm_dartree.DartreeLookupChain",
"num_speculative_tokens": K}`` (vLLM's ``custom_class`` proposer; run from the repository root so that
``engines`` imports).

vLLM's custom proposer interface hands a proposer token ids only (no target hidden states), and verifies a
chain of at most K draft tokens per request.  So the dartree proposer that fits it is the prompt-lookup
drafter (:class:`dartree.lookup.PromptLookupDrafter`) with the ``chain`` builder: each request's context
becomes a block, the builder makes the chain, its tokens are the draft.  Tree proposers need vLLM's tree
attention backend (GPU only) and a DFlash-style drafter needs the target's hidden states: both on paper
(docs/serving.md).
"""

from __future__ import annotations

import torch

from dartree import make_builder
from dartree.lookup import PromptLookupDrafter


class DartreeLookupChain:
    """vLLM custom proposer: prompt lookup drafted into a block, ``chain`` built from it."""

    def __init__(self, vllm_config) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.drafter = PromptLookupDrafter(vllm_config.model_config.get_vocab_size(), gamma=self.k)
        self.builder = make_builder("chain")

    def load_model(self, model) -> None:            # vLLM hands the target; prompt lookup reads tokens only
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        drafts = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:                          # a request that produced nothing this step: no draft
                drafts.append([])
                continue
            n = int(num_tokens_no_spec[i])
            context = token_ids_cpu[i, :n].tolist()
            proposal = self.drafter.propose(context)
            if not proposal:
                drafts.append([])
                continue
            self.drafter.reset()
            self.drafter.append_context(None, torch.tensor([context[:-1]]))
            block = self.drafter.draft(torch.tensor([context[-1]]))
            tree = self.builder.build(block)
            drafts.append(tree.tokens[0, 1: 1 + len(proposal)].tolist())
        return drafts
