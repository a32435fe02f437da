"""Stage 4, ``drafter``: the DFlash-style drafter (block 16) trained on the distillation data against
the target's greedy labels, one block per sampled anchor, all anchors of a sequence in one forward."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from dartree.training.common import budget_steps, log, optimizer_step, resume, save_checkpoint
from dartree.training.target import load_target

__all__ = ["mask_token_id", "drafter_config", "target_features", "anchored_blocks", "sample_anchors",
           "chunk_batch", "block_targets", "block_loss", "depth_weights", "validation_prompts", "decode_tau",
           "eval_drafter", "stage_drafter", "load_trained_drafter"]


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
    """Concatenated hidden states of ``layer_ids`` and the target's logits at every position."""
    out = model(input_ids=seqs, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return hidden, out.logits


def anchored_blocks(drafter, hidden: torch.Tensor, seqs: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Draft hidden states of one block per anchor, all anchors of a row in one forward: block a of row s has its
    root at ``anchors[s, a]`` and sees the context before it and its own block, as ``draft`` does.
    Shape: hidden ``[S, T, L*H]``, seqs ``[S, T]``, anchors ``[S, A]`` -> ``[S, A, gamma, H]``."""
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
    """``A`` distinct anchors per row, uniform in ``[low, high)``."""
    return torch.stack([torch.randperm(high - low, generator=gen)[:A] + low for _ in range(S)])


def chunk_batch(chunks: list[dict], rows: int, anchors: int, block_size: int, gen: torch.Generator,
                chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Rows of one distillation chunk (a random one, or ``chunk``) and anchors (blocks' roots) in their
    continuation, early enough for ``gamma`` labels.  Returns ``(tokens [S, T], anchors [S, A], sampled)``."""
    c = chunks[int(torch.randint(0, len(chunks), (1,), generator=gen)) if chunk is None else chunk]
    tokens = c["tokens"]
    picked = torch.randperm(tokens.shape[0], generator=gen)[:rows]
    x = tokens[picked].long()
    low, high = c["prompt_len"] - 1, x.shape[1] - block_size + 1
    return x, sample_anchors(x.shape[0], min(anchors, high - low), low, high, gen), bool(c["sampled"])


def block_targets(logits: torch.Tensor, anchors: torch.Tensor, gamma: int, sampled: bool) -> torch.Tensor:
    """What depths 1..gamma of each block learn from the target's logits at anchor .. anchor+gamma-1: greedy
    continuations, the argmax (int64 ``[S, A, gamma]``: the continuation itself); sampled ones, the whole
    distribution at temperature 1 (``[S, A, gamma, V]``), whose expectation along the path is the marginal."""
    idx = (anchors[:, :, None] + torch.arange(gamma)).flatten(1)               # [S, A*gamma]
    picked = torch.gather(logits, 1, idx[..., None].expand(-1, -1, logits.shape[-1]))
    picked = picked.view(*anchors.shape, gamma, logits.shape[-1])
    return torch.softmax(picked.float(), dim=-1) if sampled else picked.argmax(-1)


def block_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per (block, depth) against hard labels or a distribution: ``[..., gamma]``."""
    if targets.dtype == torch.int64:
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none").view(targets.shape)
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1)


def depth_weights(gamma: int) -> torch.Tensor:
    w = torch.exp(-torch.arange(gamma, dtype=torch.float32) / 7.0)
    return w / w.sum() * gamma


def validation_prompts(chunks: list[dict], count: int) -> list[torch.Tensor]:
    """``count`` real-text prompts (``[1, L]``) of the greedy validation chunks, row 0 of every chunk
    first, then row 1, ...: prompts of many lengths, as a real decoding run on held-out files meets."""
    greedy = [c for c in chunks if not c["sampled"]]
    out: list[torch.Tensor] = []
    for r in range(max((c["tokens"].shape[0] for c in greedy), default=0)):
        out.extend(c["tokens"][r : r + 1, : c["prompt_len"]].long() for c in greedy if r < c["tokens"].shape[0])
    return out[:count]


def decode_tau(model, drafter, prompts: list[torch.Tensor], new_tokens: int, method: str = "chain",
               head=None, temperature: float = 0.0, **config) -> float:
    """tau (tokens committed per round) of real lossless decoding: the metric that matters in use."""
    import dartree
    from dartree.decode import SpeculativeDecoder
    from dartree.verify import KeyedSampler

    was_training = drafter.training
    drafter.eval()
    decoder = SpeculativeDecoder(model, drafter, dartree.make_builder(method, **config), head=head)
    committed = rounds = 0
    with torch.no_grad():
        for i, x in enumerate(prompts):
            sampler = KeyedSampler(seed=i) if temperature > 0 else None
            out = decoder.generate(x, max_new_tokens=new_tokens, temperature=temperature, sampler=sampler)
            committed += out.tokens.shape[1]
            rounds += out.num_rounds
    drafter.train(was_training)
    return committed / max(1, rounds)


def eval_drafter(drafter, model, chunks: list[dict], args: argparse.Namespace, decode_prompts: int = 0) -> dict:
    """Teacher-forced losses, per-depth top-1 agreement and chain tau on the greedy chunks, the soft
    loss on the sampled ones and, with ``decode_prompts``, the chain tau of real greedy decoding."""
    gen = torch.Generator().manual_seed(99)
    gamma = drafter.gamma
    correct = torch.zeros(gamma)
    sums = {"loss": 0.0, "sampled_loss": 0.0, "accepted": 0.0}
    counts = {"greedy": 0, "sampled": 0}
    with torch.no_grad():
        for i in range(len(chunks)):
            x, anchors, sampled = chunk_batch(chunks, 8, 8, drafter.block_size, gen, chunk=i)
            hidden, target_logits = target_features(model, x, drafter.target_layer_ids)
            logits = F.linear(anchored_blocks(drafter, hidden, x, anchors), drafter.lm_head_weight)
            y = block_targets(target_logits, anchors, gamma, sampled)
            loss = block_loss(logits, y).mean().item()
            sums["sampled_loss" if sampled else "loss"] += loss
            counts["sampled" if sampled else "greedy"] += 1
            if sampled:
                continue
            hit = logits.argmax(-1) == y
            correct += hit.float().mean((0, 1))
            sums["accepted"] += hit.long().cumprod(-1).sum(-1).float().mean().item()
    g = max(1, counts["greedy"])
    out = {"loss": sums["loss"] / g, "sampled_loss": sums["sampled_loss"] / max(1, counts["sampled"]),
           "acc_by_depth": (correct / g).tolist(), "chain_tau": sums["accepted"] / g + 1.0}
    if decode_prompts:
        out["decode_chain_tau"] = decode_tau(model, drafter, validation_prompts(chunks, decode_prompts),
                                             args.distill_new_tokens - drafter.block_size)
    return out


def stage_drafter(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.drafter import DFlashDrafter
    from dartree.training.distill import load_distill

    final = work / "drafter_final.pt"
    if final.exists():
        return
    model = load_target(work)
    distill = load_distill(work)
    torch.manual_seed(1)
    if args.init_from is not None:          # warm start from a released bundle's drafter
        from dartree.models.loaders import load_drafter

        start = load_drafter(args.init_from / "drafter", target=model)
        if start.config.shift_label or start.heads:
            raise ValueError(f"--init-from: {args.init_from / 'drafter'} is a shift_label or head-carrying "
                             "checkpoint; the training stages train the zoo layout (shift_label false, heads apart)")
        config = start.config
        drafter = DFlashDrafter(config, target=model)
        drafter.load_state_dict(start.state_dict())
        log(f"drafter: warm start from {args.init_from / 'drafter'}")
        if args.drafter_minutes <= 0:           # keep the bundle's drafter as it is (retrain the heads only)
            torch.save({"model": drafter.state_dict(), "config": config.to_dict()}, final)
            (work / "drafter_stats.json").write_text(json.dumps({"kept_from": str(args.init_from)}, indent=1))
            log(f"drafter: kept from {args.init_from / 'drafter'} (--drafter-minutes 0)")
            return
    else:
        config = drafter_config(model, args)
        drafter = DFlashDrafter(config, target=model)
    params = [p for p in drafter.parameters()]
    opt = torch.optim.AdamW(params, lr=args.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01)
    ckpt_path = work / "drafter_ckpt.pt"
    state = resume(ckpt_path, "drafter", {"model": drafter}, opt)
    n_params = sum(p.numel() for p in params)
    log(f"drafter: {n_params / 1e6:.2f}M parameters, target layers {config.target_layer_ids}")
    train, validation = distill["train"], distill["validation"]
    if state["step"] == 0:
        ev = eval_drafter(drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
        state["initial"] = ev
        log(f"drafter before training: {_summary(ev)}")
    gen = torch.Generator().manual_seed(state["step"] + 11)
    weights = depth_weights(config.gamma)
    drafter.train()
    for t0, lr, bar in budget_steps("drafter", args.drafter_minutes, args.drafter_lr, 50, state,
                                    lambda: save_checkpoint(ckpt_path, {"model": drafter}, opt, state)):
        x, anchors, sampled = chunk_batch(train, args.drafter_batch, args.anchors, config.block_size, gen)
        hidden, target_logits = target_features(model, x, config.target_layer_ids)
        y = block_targets(target_logits, anchors, config.gamma, sampled)
        logits = F.linear(anchored_blocks(drafter, hidden, x, anchors), drafter.lm_head_weight)
        loss = (block_loss(logits, y) * weights).mean()
        optimizer_step(opt, loss, params, lr, state, t0, bar)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % args.eval_every == 0:
            drafter.eval()
            ev = eval_drafter(drafter, model, validation[:16], args, decode_prompts=args.decode_prompts)
            drafter.train()
            state["history"].append((state["step"], loss.item(), ev["loss"], ev["chain_tau"],
                                     ev.get("decode_chain_tau")))
            log(f"drafter step {state['step']}: train {loss.item():.3f} {_summary(ev)}")
    drafter.eval()
    ev = eval_drafter(drafter, model, validation, args, decode_prompts=2 * args.decode_prompts)
    state["final"] = ev
    log(f"drafter done: {_summary(ev)}, acc by depth {[round(a, 2) for a in ev['acc_by_depth']]}")
    torch.save({"model": drafter.state_dict(), "config": config.to_dict()}, final)
    (work / "drafter_stats.json").write_text(json.dumps(state, indent=1))


def _summary(ev: dict) -> str:
    text = (f"validation greedy {ev['loss']:.3f} sampled {ev['sampled_loss']:.3f}, "
            f"teacher-forced chain tau {ev['chain_tau']:.2f}")
    if "decode_chain_tau" in ev:
        text += f", decoded chain tau {ev['decode_chain_tau']:.2f}"
    return text


def load_trained_drafter(work: Path, model):
    from dartree.models.drafter import DFlashConfig, DFlashDrafter

    ck = torch.load(work / "drafter_final.pt", weights_only=False)
    drafter = DFlashDrafter(DFlashConfig(**ck["config"]), target=model)
    drafter.load_state_dict(ck["model"])
    return drafter.eval().requires_grad_(False)
