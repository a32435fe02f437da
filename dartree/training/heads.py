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
    block_labels,
    load_trained_drafter,
    sample_anchors,
    target_features,
)
from dartree.training.target import load_target

__all__ = ["head_batch", "head_losses", "eval_heads", "stage_heads", "nn_init_zero"]


def head_batch(drafter, model, x: torch.Tensor, anchors: torch.Tensor):
    """Frozen drafter outputs and greedy labels for a batch of anchored blocks."""
    with torch.no_grad():
        hidden, labels = target_features(model, x, drafter.target_layer_ids)
        h = anchored_blocks(drafter, hidden, x, anchors)                   # [S, A, gamma, H]
        base = F.linear(h, drafter.lm_head_weight)
        y = block_labels(labels, anchors, drafter.gamma)                   # [S, A, gamma]
        roots = torch.gather(x, 1, anchors)
    previous = torch.cat([roots[..., None], y[..., :-1]], dim=-1)          # token before each depth
    return h.flatten(0, 1), base.flatten(0, 1), y.flatten(0, 1), previous.flatten(0, 1)


def head_losses(gru, markov, h, base, y, previous) -> tuple[torch.Tensor, torch.Tensor]:
    states, _ = gru.prefix_gru(F.embedding(previous, gru.embedding_weight))  # [N, gamma, G]
    p = gru.prefix_len
    gru_logits = gru.full_logits(base[:, p:], h[:, p:], states[:, p:])
    gru_loss = F.cross_entropy(gru_logits.flatten(0, 1), y[:, p:].flatten())
    markov_logits = markov.full_logits(base, previous)
    markov_loss = F.cross_entropy(markov_logits.flatten(0, 1), y.flatten())
    return gru_loss, markov_loss


def eval_heads(gru, markov, drafter, model, seqs, args) -> dict:
    gen = torch.Generator().manual_seed(99)
    totals = {"base": 0.0, "gru": 0.0, "markov": 0.0}
    taus = {"base": 0.0, "gru": 0.0, "markov": 0.0}
    n = 0
    with torch.no_grad():
        for i in range(0, seqs.shape[0], 8):
            x = seqs[i : i + 8].long()
            anchors = sample_anchors(x.shape[0], 8, args.prompt_len - 1, x.shape[1] - drafter.block_size, gen)
            h, base, y, previous = head_batch(drafter, model, x, anchors)
            g, mk = head_losses(gru, markov, h, base, y, previous)
            p = gru.prefix_len
            totals["base"] += F.cross_entropy(base[:, p:].flatten(0, 1), y[:, p:].flatten()).item()
            totals["gru"] += g.item()
            totals["markov"] += mk.item()
            # teacher-forced chain acceptance: argmax of each head along the greedy path
            states, _ = gru.prefix_gru(F.embedding(previous, gru.embedding_weight))
            gl = base.clone()
            gl[:, p:] = gru.full_logits(base[:, p:], h[:, p:], states[:, p:])
            for name, logits in (("base", base), ("gru", gl), ("markov", markov.full_logits(base, previous))):
                hit = logits.argmax(-1) == y
                taus[name] += hit.long().cumprod(-1).sum(-1).float().mean().item() + 1.0
            n += 1
    out = {f"{k}_loss_depth_gt_{gru.prefix_len}": v / n for k, v in totals.items() if k != "markov"}
    out["markov_loss"] = totals["markov"] / n
    out.update({f"{k}_chain_tau_teacher_forced": v / n for k, v in taus.items()})
    return out


def stage_heads(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead

    final = work / "heads_final.pt"
    if final.exists():
        return
    model = load_target(work)
    drafter = load_trained_drafter(work, model)
    distill = torch.load(work / "distill.pt")
    c = model.config
    torch.manual_seed(2)
    gru = GRUHead(c.hidden_size, c.vocab_size, args.gru_hidden, args.gru_emb_dim, prefix_len=1,
                  embedding=model.get_input_embeddings().weight)
    nn_init_zero(gru.embed_proj[2])
    markov = MarkovHead(c.vocab_size, args.markov_rank)
    torch.nn.init.normal_(markov.markov_w1.weight, std=0.02)
    torch.nn.init.zeros_(markov.markov_w2.weight)
    params = list(gru.parameters()) + list(markov.parameters())
    opt = torch.optim.AdamW(params, lr=args.heads_lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt_path = work / "heads_ckpt.pt"
    state = resume(ckpt_path, "heads", {"gru": gru, "markov": markov}, opt)
    ev = eval_heads(gru, markov, drafter, model, distill["validation"][:32], args)
    log(f"heads: before training {ev}")
    train = distill["train"]
    gen = torch.Generator().manual_seed(state["step"] + 13)
    budget = args.heads_minutes * 60.0
    bar = tqdm(desc="heads", initial=state["step"], mininterval=20)
    last_save = time.time()
    while state["elapsed"] < budget:
        t0 = time.time()
        rows = torch.randint(0, train.shape[0], (args.drafter_batch,), generator=gen)
        x = train[rows].long()
        anchors = sample_anchors(x.shape[0], args.anchors, args.prompt_len - 1, x.shape[1] - drafter.block_size, gen)
        h, base, y, previous = head_batch(drafter, model, x, anchors)
        g, mk = head_losses(gru, markov, h, base, y, previous)
        loss = g + mk
        lr = lr_at(state["step"], state["elapsed"] / budget, args.heads_lr, 30)
        optimizer_step(opt, loss, params, lr, state, t0, bar)
        bar.set_postfix(gru=f"{g.item():.3f}", markov=f"{mk.item():.3f}")
        if time.time() - last_save > 300:
            save_checkpoint(ckpt_path, {"gru": gru, "markov": markov}, opt, state)
            last_save = time.time()
    bar.close()
    ev = eval_heads(gru, markov, drafter, model, distill["validation"], args)
    state["final"] = ev
    log(f"heads done: {ev}")
    torch.save({"gru": gru.state_dict(), "markov": markov.state_dict(),
                "gru_config": {"gru_hidden_dim": args.gru_hidden, "emb_dim": args.gru_emb_dim, "prefix_len": 1},
                "markov_config": {"markov_rank": args.markov_rank}}, final)
    (work / "heads_stats.json").write_text(json.dumps(state, indent=1))


def nn_init_zero(linear: torch.nn.Linear) -> None:
    torch.nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        torch.nn.init.zeros_(linear.bias)
