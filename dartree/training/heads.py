"""Stage 5, ``heads``: the GRU (Domino) and Markov (DSpark) correction heads, trained on the frozen
drafter's block outputs against the same greedy labels."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dartree.training.common import log, lr_at, optimizer_step, resume, save_checkpoint
from dartree.training.drafter import (
    anchored_blocks,
    block_loss,
    block_targets,
    chunk_batch,
    decode_tau,
    load_trained_drafter,
    target_features,
    validation_prompts,
)
from dartree.training.target import load_target

__all__ = ["head_batch", "head_losses", "eval_heads", "stage_heads", "nn_init_zero"]


def head_batch(drafter, model, x: torch.Tensor, anchors: torch.Tensor, sampled: bool):
    """Frozen drafter outputs, targets (:func:`block_targets`) and the path tokens before each depth,
    for a batch of anchored blocks: the heads condition on the committed path, as in decoding."""
    with torch.no_grad():
        hidden, target_logits = target_features(model, x, drafter.target_layer_ids)
        h = anchored_blocks(drafter, hidden, x, anchors)                   # [S, A, gamma, H]
        base = F.linear(h, drafter.lm_head_weight)
        y = block_targets(target_logits, anchors, drafter.gamma, sampled)  # [S, A, gamma(, V)]
        previous = torch.gather(x, 1, (anchors[:, :, None] + torch.arange(drafter.gamma)).flatten(1))
    previous = previous.view(*anchors.shape, drafter.gamma)                # token before each depth
    return h.flatten(0, 1), base.flatten(0, 1), y.flatten(0, 1), previous.flatten(0, 1)


def head_logits(gru, markov, h, base, previous) -> tuple[torch.Tensor, torch.Tensor]:
    """The GRU head's logits at depths > its prefix (``[N, gamma - p, V]``) and the Markov head's at
    every depth (``[N, gamma, V]``), teacher-forced along ``previous``."""
    states, _ = gru.prefix_gru(F.embedding(previous, gru.embedding_weight))  # [N, gamma, G]
    p = gru.prefix_len
    return gru.full_logits(base[:, p:], h[:, p:], states[:, p:]), markov.full_logits(base, previous)


def head_losses(gru, markov, h, base, y, previous) -> tuple[torch.Tensor, torch.Tensor]:
    gru_logits, markov_logits = head_logits(gru, markov, h, base, previous)
    return block_loss(gru_logits, y[:, gru.prefix_len:]).mean(), block_loss(markov_logits, y).mean()


def eval_heads(gru, markov, drafter, model, chunks: list[dict], args, decode_prompts: int = 0) -> dict:
    """Greedy-chunk losses and teacher-forced chain tau per head, sampled-chunk losses and, with
    ``decode_prompts``, the corrected-chain tau of real greedy decoding per head."""
    gen = torch.Generator().manual_seed(99)
    names = ("base", "gru", "markov")
    totals = {f"{k}_{kind}": 0.0 for k in names for kind in ("loss", "sampled_loss", "tau")}
    counts = {"greedy": 0, "sampled": 0}
    p = gru.prefix_len
    with torch.no_grad():
        for i in range(len(chunks)):
            x, anchors, sampled = chunk_batch(chunks, 8, 8, drafter.block_size, gen, chunk=i)
            h, base, y, previous = head_batch(drafter, model, x, anchors, sampled)
            gl_tail, ml = head_logits(gru, markov, h, base, previous)
            gl = torch.cat([base[:, :p], gl_tail], dim=1)
            kind = "sampled_loss" if sampled else "loss"
            counts["sampled" if sampled else "greedy"] += 1
            for name, logits in (("base", base), ("gru", gl), ("markov", ml)):
                totals[f"{name}_{kind}"] += block_loss(logits, y).mean().item()
                if not sampled:         # teacher-forced chain acceptance: argmax along the greedy path
                    hit = logits.argmax(-1) == y
                    totals[f"{name}_tau"] += hit.long().cumprod(-1).sum(-1).float().mean().item() + 1.0
    out = {key: value / max(1, counts["sampled" if "sampled" in key else "greedy"]) for key, value in totals.items()}
    if decode_prompts:
        prompts = validation_prompts(chunks, decode_prompts)
        new = args.distill_new_tokens - drafter.block_size
        for name, head in (("gru", gru), ("markov", markov)):
            head.eval()
            out[f"{name}_decode_tau"] = decode_tau(model, drafter, prompts, new, "corrected-chain", head=head)
    return out


def _summary(ev: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in ev.items())


def stage_heads(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead
    from dartree.training.distill import load_distill

    final = work / "heads_final.pt"
    if final.exists():
        return
    model = load_target(work)
    drafter = load_trained_drafter(work, model)
    distill = load_distill(work)
    c = model.config
    torch.manual_seed(2)
    gru_config = {"gru_hidden_dim": args.gru_hidden, "emb_dim": args.gru_emb_dim, "prefix_len": 1}
    markov_config = {"markov_rank": args.markov_rank}
    started = None
    if args.init_from is not None:          # warm start from a released bundle's heads, with their settings
        from dartree.models.loaders import load_head

        started = {name: load_head(args.init_from / f"{name}_head", target=model) for name in ("gru", "markov")}
        g = started["gru"]
        gru_config = {"gru_hidden_dim": g.gru_hidden_dim, "emb_dim": g.emb_dim, "prefix_len": g.prefix_len}
        markov_config = {"markov_rank": started["markov"].markov_w1.weight.shape[1]}
    gru = GRUHead(c.hidden_size, c.vocab_size, **gru_config, embedding=model.get_input_embeddings().weight)
    nn_init_zero(gru.embed_proj[2])
    markov = MarkovHead(c.vocab_size, **markov_config)
    torch.nn.init.normal_(markov.markov_w1.weight, std=0.02)
    torch.nn.init.zeros_(markov.markov_w2.weight)
    if started is not None:
        gru.load_state_dict(started["gru"].state_dict())
        markov.load_state_dict(started["markov"].state_dict())
        log(f"heads: warm start from {args.init_from} ({gru_config}, {markov_config})")
    params = list(gru.parameters()) + list(markov.parameters())
    opt = torch.optim.AdamW(params, lr=args.heads_lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt_path = work / "heads_ckpt.pt"
    state = resume(ckpt_path, "heads", {"gru": gru, "markov": markov}, opt)
    train, validation = distill["train"], distill["validation"]
    if state["step"] == 0:
        ev = eval_heads(gru, markov, drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
        state["initial"] = ev
        log(f"heads before training: {_summary(ev)}")
    gen = torch.Generator().manual_seed(state["step"] + 13)
    budget = args.heads_minutes * 60.0
    bar = tqdm(desc="heads", initial=state["step"], mininterval=20)
    last_save = time.time()
    gru.train()
    markov.train()
    while state["elapsed"] < budget:
        t0 = time.time()
        x, anchors, sampled = chunk_batch(train, args.drafter_batch, args.anchors, drafter.block_size, gen)
        h, base, y, previous = head_batch(drafter, model, x, anchors, sampled)
        g, mk = head_losses(gru, markov, h, base, y, previous)
        loss = g + mk
        lr = lr_at(state["step"], state["elapsed"] / budget, args.heads_lr, 30)
        optimizer_step(opt, loss, params, lr, state, t0, bar)
        bar.set_postfix(gru=f"{g.item():.3f}", markov=f"{mk.item():.3f}")
        if state["step"] % args.eval_every == 0:
            ev = eval_heads(gru, markov, drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
            gru.train()
            markov.train()
            state["history"].append((state["step"], g.item(), mk.item(), ev))
            log(f"heads step {state['step']}: {_summary(ev)}")
        if time.time() - last_save > 300:
            save_checkpoint(ckpt_path, {"gru": gru, "markov": markov}, opt, state)
            last_save = time.time()
    bar.close()
    ev = eval_heads(gru, markov, drafter, model, validation, args, decode_prompts=2 * args.decode_prompts)
    state["final"] = ev
    log(f"heads done: {_summary(ev)}")
    torch.save({"gru": gru.state_dict(), "markov": markov.state_dict(),
                "gru_config": gru_config, "markov_config": markov_config}, final)
    (work / "heads_stats.json").write_text(json.dumps(state, indent=1))


def nn_init_zero(linear: torch.nn.Linear) -> None:
    torch.nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        torch.nn.init.zeros_(linear.bias)
