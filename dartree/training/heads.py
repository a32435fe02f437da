"""Stage 5, ``heads``: the GRU (Domino) and Markov (DSpark) correction heads, trained on the frozen drafter's
block outputs against the same greedy labels.

Several GRU widths (``--gru-widths 64x64,128x128``) train side by side on the same batches (the frozen
models run once per step for all), each with its own parameters and clipping, so each trains as it would
alone.  The first is exported as ``gru_head/``; with several, each also as ``gru_head_<G>x<E>/``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from dartree.training.common import budget_steps, log, optimizer_step, resume, save_checkpoint
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

__all__ = ["head_batch", "gru_logits", "eval_heads", "stage_heads", "gru_name"]


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


def gru_logits(gru, h, base, previous) -> torch.Tensor:
    """The GRU head's logits at depths > its prefix (``[N, gamma - p, V]``), teacher-forced along ``previous``."""
    states, _ = gru.prefix_gru(F.embedding(previous, gru.embedding_weight))  # [N, gamma, G]
    p = gru.prefix_len
    return gru.full_logits(base[:, p:], h[:, p:], states[:, p:])


def gru_name(config: dict, several: bool) -> str:
    """``gru`` for a single GRU width, ``gru_<G>x<E>`` when several are trained side by side."""
    return f"gru_{config['gru_hidden_dim']}x{config['emb_dim']}" if several else "gru"


def eval_heads(grus: dict, markov, drafter, model, chunks: list[dict], args, decode_prompts: int = 0) -> dict:
    """Greedy-chunk losses and teacher-forced chain tau per head (``grus``: name -> GRU head, plus
    ``markov`` unless it is None), sampled-chunk losses and, with ``decode_prompts``, the
    corrected-chain tau of real greedy decoding per head."""
    gen = torch.Generator().manual_seed(99)
    names = ("base", *grus, *(("markov",) if markov is not None else ()))
    totals = {f"{k}_{kind}": 0.0 for k in names for kind in ("loss", "sampled_loss", "tau")}
    counts = {"greedy": 0, "sampled": 0}
    with torch.no_grad():
        for i in range(len(chunks)):
            x, anchors, sampled = chunk_batch(chunks, 8, 8, drafter.block_size, gen, chunk=i)
            h, base, y, previous = head_batch(drafter, model, x, anchors, sampled)
            logits = {"base": base}
            if markov is not None:
                logits["markov"] = markov.full_logits(base, previous)
            for name, gru in grus.items():
                logits[name] = torch.cat([base[:, :gru.prefix_len], gru_logits(gru, h, base, previous)], dim=1)
            kind = "sampled_loss" if sampled else "loss"
            counts["sampled" if sampled else "greedy"] += 1
            for name in names:
                totals[f"{name}_{kind}"] += block_loss(logits[name], y).mean().item()
                if not sampled:         # teacher-forced chain acceptance: argmax along the greedy path
                    hit = logits[name].argmax(-1) == y
                    totals[f"{name}_tau"] += hit.long().cumprod(-1).sum(-1).float().mean().item() + 1.0
    out = {key: value / max(1, counts["sampled" if "sampled" in key else "greedy"]) for key, value in totals.items()}
    if decode_prompts:
        prompts = validation_prompts(chunks, decode_prompts)
        new = args.distill_new_tokens - drafter.block_size
        for name, head in (*grus.items(), *((("markov", markov),) if markov is not None else ())):
            head.eval()
            out[f"{name}_decode_tau"] = decode_tau(model, drafter, prompts, new, "corrected-chain", head=head)
    return out


def _summary(ev: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in ev.items())


def stage_heads(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead
    from dartree.models.loaders import load_head
    from dartree.training.distill import load_distill

    final = work / "heads_final.pt"
    if final.exists():
        return
    model = load_target(work)
    drafter = load_trained_drafter(work, model)
    distill = load_distill(work)
    c = model.config
    torch.manual_seed(2)
    started = {}                                      # the --init-from bundle's heads (name -> head)
    if args.init_from is not None:
        started = {name: load_head(args.init_from / f"{name}_head", target=model) for name in ("gru", "markov")}
    widths = args.gru_widths or [(args.gru_hidden, args.gru_emb_dim)]
    gru_configs = [{"gru_hidden_dim": g, "emb_dim": e, "prefix_len": 1} for g, e in widths]
    if not args.gru_widths and "gru" in started:     # one width, none asked for: the bundle's settings
        g = started["gru"]
        gru_configs = [{"gru_hidden_dim": g.gru_hidden_dim, "emb_dim": g.emb_dim, "prefix_len": g.prefix_len}]
    rank = args.markov_rank                           # None: the bundle's rank, else 128
    if rank is None:
        rank = started["markov"].markov_w1.weight.shape[1] if "markov" in started else 128
    markov_config = {"markov_rank": rank}
    several = len(gru_configs) > 1
    warm: set[str] = set()                   # the heads warm-started from --init-from
    grus: dict[str, GRUHead] = {}
    for config in gru_configs:
        gru = GRUHead(c.hidden_size, c.vocab_size, **config, embedding=model.get_input_embeddings().weight)
        for p in gru.embed_proj[2].parameters():       # the correction starts at zero
            torch.nn.init.zeros_(p)
        s = started.get("gru")
        if s is not None and (s.gru_hidden_dim, s.emb_dim, s.prefix_len) == tuple(config.values()):
            gru.load_state_dict(s.state_dict())     # warm start only where the bundle's head has this width
            warm.add(gru_name(config, several))
            log(f"heads: GRU {config} warm-started from {args.init_from}")
        else:
            log(f"heads: GRU {config} from a fresh initialisation")
        grus[gru_name(config, several)] = gru
    markov = MarkovHead(c.vocab_size, **markov_config)
    torch.nn.init.normal_(markov.markov_w1.weight, std=0.02)
    torch.nn.init.zeros_(markov.markov_w2.weight)
    if "markov" in started and started["markov"].markov_w1.weight.shape[1] == markov_config["markov_rank"]:
        markov.load_state_dict(started["markov"].state_dict())
        warm.add("markov")
        log(f"heads: Markov {markov_config} warm-started from {args.init_from}")
    train_markov = "markov" in args.head_kinds
    evaluated = markov if train_markov else None          # an untrained Markov head is not re-measured
    trained = {**grus, **({"markov": markov} if train_markov else {})}
    groups = [list(m.parameters()) for m in trained.values()]
    params = [p for group in groups for p in group]
    opt = torch.optim.AdamW(params, lr=args.heads_lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt_path = work / "heads_ckpt.pt"
    state = resume(ckpt_path, "heads", {**grus, "markov": markov}, opt)
    train, validation = distill["train"], distill["validation"]
    fresh = all(name not in warm for name in trained)
    if state["step"] == 0 and fresh:        # fc2 / markov_w2 start at zero: every corrected logit is the base's
        log("heads before training: every head starts uncorrected (zero output projection), not re-measured")
    elif state["step"] == 0:
        ev = eval_heads(grus, evaluated, drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
        state["initial"] = ev
        log(f"heads before training: {_summary(ev)}")
    gen = torch.Generator().manual_seed(state["step"] + 13)
    for m in trained.values():
        m.train()
    for t0, lr, bar in budget_steps("heads", args.heads_minutes, args.heads_lr, 30, state,
                                    lambda: save_checkpoint(ckpt_path, {**grus, "markov": markov}, opt, state)):
        x, anchors, sampled = chunk_batch(train, args.drafter_batch, args.anchors, drafter.block_size, gen)
        h, base, y, previous = head_batch(drafter, model, x, anchors, sampled)
        losses = {name: block_loss(gru_logits(gru, h, base, previous), y[:, gru.prefix_len:]).mean()
                  for name, gru in grus.items()}
        if train_markov:
            losses["markov"] = block_loss(markov.full_logits(base, previous), y).mean()
        optimizer_step(opt, sum(losses.values()), groups, lr, state, t0, bar)
        bar.set_postfix({name: f"{loss.item():.3f}" for name, loss in losses.items()})
        if state["step"] % args.eval_every == 0:
            ev = eval_heads(grus, evaluated, drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
            for m in trained.values():
                m.train()
            state["history"].append((state["step"], {name: loss.item() for name, loss in losses.items()}, ev))
            log(f"heads step {state['step']}: {_summary(ev)}")
    save_checkpoint(ckpt_path, {**grus, "markov": markov}, opt, state)   # a longer --heads-minutes resumes here
    ev = eval_heads(grus, evaluated, drafter, model, validation, args, decode_prompts=2 * args.decode_prompts)
    state["final"] = ev
    log(f"heads done: {_summary(ev)}")
    first = next(iter(grus.values()))
    torch.save({"gru": first.state_dict(), "markov": markov.state_dict(),
                "gru_config": gru_configs[0], "markov_config": markov_config,
                "gru_widths": [{"config": config, "state": gru.state_dict()}
                               for config, gru in zip(gru_configs, grus.values(), strict=True)]}, final)
    (work / "heads_stats.json").write_text(json.dumps(state, indent=1))
