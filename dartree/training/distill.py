"""Stage 3, ``distill``: the frozen target greedily continues corpus prompts; those continuations are
the distillation data (teacher forcing on them is exactly the target's greedy labels)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

from dartree.training.common import log
from dartree.training.data import load_data, random_windows
from dartree.training.target import load_target

__all__ = ["greedy_continue", "stage_distill"]


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation with a KV cache.  Shape: prompts ``[b, p]`` -> ``[b, p + new_tokens]``."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompts, cache=cache, use_cache=True)
    tokens = [prompts, out.logits[:, -1:].argmax(-1)]
    pos = prompts.shape[1]
    for _ in range(new_tokens - 1):
        position_ids = torch.full((prompts.shape[0], 1), pos, dtype=torch.int64)
        out = model(input_ids=tokens[-1], position_ids=position_ids, cache=cache, use_cache=True)
        tokens.append(out.logits[:, -1:].argmax(-1))
        pos += 1
    return torch.cat(tokens, dim=1)


def stage_distill(work: Path, args: argparse.Namespace) -> None:
    path = work / "distill.pt"
    if path.exists():
        return
    data = load_data(work)
    model = load_target(work)
    gen = torch.Generator().manual_seed(7)
    out = {}
    for split, count in (("train", args.distill_sequences), ("validation", 64)):
        chunks = []
        bar = tqdm(total=count, desc=f"distill {split}", mininterval=20)
        while sum(c.shape[0] for c in chunks) < count:
            prompts = random_windows(data[split], 64, args.prompt_len, gen)
            chunks.append(greedy_continue(model, prompts, args.seq - args.prompt_len))
            bar.update(prompts.shape[0])
        bar.close()
        out[split] = torch.cat(chunks)[:count].to(torch.int32)
    torch.save(out, path)
    log(f"distill: {out['train'].shape[0]} train / {out['validation'].shape[0]} validation sequences")
