"""Stage 4, ``drafter``: the DFlash-style drafter (block 16) trained on the distillation data against
the target's greedy labels, one block per sampled anchor, all anchors of a sequence in one forward."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dartree.training.common import log, lr_at, optimizer_step, resume, save_checkpoint
from dartree.training.target import load_target

__all__ = ["mask_token_id", "drafter_config", "target_features", "anchored_blocks", "sample_anchors",
           "block_labels", "depth_weights", "eval_drafter", "stage_drafter", "load_trained_drafter"]


def mask_token_id(work: Path) -> int:
    """Id of ``<|mask|>`` in the trained tokenizer (the drafter's mask token)."""
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(work / "tokenizer.json")).token_to_id("<|mask|>"))


def drafter_config(model, args: argparse.Namespace):
    from dartree.models.drafter import DFlashConfig, dflash_target_layer_ids

    c = model.config
    return DFlashConfig(
        hidden_size=c.hidden_size,
        num_hidden_layers=args.drafter_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size,
        target_layer_ids=dflash_target_layer_ids(c.num_hidden_layers, args.drafter_layers),
        num_target_layers=c.num_hidden_layers,
        mask_token_id=mask_token_id(args.work),
        block_size=args.block_size,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=float(c.rope_parameters["rope_theta"]),
    )


@torch.no_grad()
def target_features(model, seqs: torch.Tensor, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated hidden states of ``layer_ids`` and the greedy labels (argmax next token)."""
    out = model(input_ids=seqs, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return hidden, out.logits.argmax(-1)


def anchored_blocks(drafter, hidden: torch.Tensor, seqs: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Draft hidden states of one block per anchor, all anchors of a row in one forward.

    Block a of row s has its root at position ``anchors[s, a]``, sees the context features of the
    positions before it, and its own block (non-causal) -- exactly what ``draft`` sees at decode time.

    Shape:
        hidden ``[S, T, L*H]``, seqs ``[S, T]``, anchors ``[S, A]`` -> ``[S, A, gamma, H]``.
    """
    S, T = seqs.shape
    A, bs = anchors.shape[1], drafter.block_size
    feats = drafter.context_features(hidden)
    ctx = drafter.context_key_values(feats, torch.arange(T))
    offsets = torch.arange(bs)
    positions = (anchors[:, :, None] + offsets).reshape(S, A * bs)
    block_id = torch.arange(A).repeat_interleave(bs)
    sees_ctx = torch.arange(T)[None, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]  # [S, A*bs, T]
    sees_block = (block_id[:, None] == block_id[None, :]).expand(S, -1, -1)
    mask = torch.cat([sees_ctx, sees_block], dim=2)[:, None]
    roots = torch.gather(seqs, 1, anchors)
    out = drafter.block_hidden(roots, positions, ctx, mask)
    return out.view(S, A, bs, -1)[:, :, 1:]


def sample_anchors(S: int, A: int, low: int, high: int, gen: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(high - low, generator=gen)[:A] + low for _ in range(S)])


def block_labels(labels: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """Greedy labels of depths 1..gamma: the target's argmax at positions anchor .. anchor+gamma-1."""
    idx = anchors[:, :, None] + torch.arange(gamma)
    return torch.gather(labels, 1, idx.flatten(1)).view(*anchors.shape, gamma)


def depth_weights(gamma: int) -> torch.Tensor:
    w = torch.exp(-torch.arange(gamma, dtype=torch.float32) / 7.0)
    return w / w.sum() * gamma


def eval_drafter(drafter, model, seqs: torch.Tensor, args: argparse.Namespace) -> dict:
    """Teacher-forced per-depth accuracy and expected accepted length of the drafter's argmax chain."""
    gen = torch.Generator().manual_seed(99)
    gamma = drafter.gamma
    correct = torch.zeros(gamma)
    accepted = 0.0
    total_loss, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, seqs.shape[0], 8):
            x = seqs[i : i + 8].long()
            hidden, labels = target_features(model, x, drafter.target_layer_ids)
            anchors = sample_anchors(x.shape[0], 8, args.prompt_len - 1, x.shape[1] - drafter.block_size, gen)
            h = anchored_blocks(drafter, hidden, x, anchors)
            logits = F.linear(h, drafter.lm_head_weight)
            y = block_labels(labels, anchors, gamma)
            total_loss += F.cross_entropy(logits.flatten(0, 2), y.flatten()).item()
            n += 1
            hit = logits.argmax(-1) == y
            correct += hit.float().mean((0, 1))
            accepted += hit.long().cumprod(-1).sum(-1).float().mean().item()
    batches = n
    return {"loss": total_loss / batches, "acc_by_depth": (correct / batches).tolist(),
            "chain_tau": accepted / batches + 1.0}


def stage_drafter(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.drafter import DFlashDrafter

    final = work / "drafter_final.pt"
    if final.exists():
        return
    model = load_target(work)
    distill = torch.load(work / "distill.pt")
    config = drafter_config(model, args)
    torch.manual_seed(1)
    drafter = DFlashDrafter(config, target=model)
    params = [p for p in drafter.parameters()]
    opt = torch.optim.AdamW(params, lr=args.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01)
    ckpt_path = work / "drafter_ckpt.pt"
    state = resume(ckpt_path, "drafter", {"model": drafter}, opt)
    n_params = sum(p.numel() for p in params)
    log(f"drafter: {n_params / 1e6:.2f}M parameters, target layers {config.target_layer_ids}")
    train = distill["train"]
    gen = torch.Generator().manual_seed(state["step"] + 11)
    weights = depth_weights(config.gamma)
    budget = args.drafter_minutes * 60.0
    bar = tqdm(desc="drafter", initial=state["step"], mininterval=20)
    last_save = time.time()
    drafter.train()
    while state["elapsed"] < budget:
        t0 = time.time()
        rows = torch.randint(0, train.shape[0], (args.drafter_batch,), generator=gen)
        x = train[rows].long()
        hidden, labels = target_features(model, x, config.target_layer_ids)
        anchors = sample_anchors(x.shape[0], args.anchors, args.prompt_len - 1, x.shape[1] - config.block_size, gen)
        h = anchored_blocks(drafter, hidden, x, anchors)
        logits = F.linear(h, drafter.lm_head_weight)
        y = block_labels(labels, anchors, config.gamma)
        ce = F.cross_entropy(logits.flatten(0, 2), y.flatten(), reduction="none").view(y.shape)
        loss = (ce * weights).mean()
        lr = lr_at(state["step"], state["elapsed"] / budget, args.drafter_lr, 50)
        optimizer_step(opt, loss, params, lr, state, t0, bar)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % 200 == 0:
            drafter.eval()
            ev = eval_drafter(drafter, model, distill["validation"][:32], args)
            drafter.train()
            state["history"].append((state["step"], loss.item(), ev["loss"], ev["chain_tau"]))
            log(f"drafter step {state['step']}: train {loss.item():.3f} validation {ev['loss']:.3f} "
                f"chain tau {ev['chain_tau']:.2f}")
        if time.time() - last_save > 300:
            save_checkpoint(ckpt_path, {"model": drafter}, opt, state)
            last_save = time.time()
    bar.close()
    drafter.eval()
    ev = eval_drafter(drafter, model, distill["validation"], args)
    state["final"] = ev
    log(f"drafter done: validation loss {ev['loss']:.4f}, chain tau {ev['chain_tau']:.2f}, "
        f"acc by depth {[round(a, 2) for a in ev['acc_by_depth']]}")
    torch.save({"model": drafter.state_dict(), "config": config.to_dict()}, final)
    (work / "drafter_stats.json").write_text(json.dumps(state, indent=1))


def load_trained_drafter(work: Path, model):
    from dartree.models.drafter import DFlashConfig, DFlashDrafter

    ck = torch.load(work / "drafter_final.pt", weights_only=False)
    drafter = DFlashDrafter(DFlashConfig(**ck["config"]), target=model)
    drafter.load_state_dict(ck["model"])
    drafter.eval()
    for p in drafter.parameters():
        p.requires_grad_(False)
    return drafter
