"""Stage 2, ``target``: a small ``Qwen3ForCausalLM`` trained from scratch for a wall-clock budget
(the schedule follows elapsed time; a resume continues it from the checkpoint)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from dartree.training.common import SPECIAL_TOKENS, budget_steps, log, optimizer_step, resume, save_checkpoint
from dartree.training.data import load_data, random_windows

__all__ = ["target_config", "eval_target", "stage_target", "load_target"]


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


def eval_target(model, ids: torch.Tensor, seq: int, batches: int = 8) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    total = 0.0
    for _ in range(batches):
        x = random_windows(ids, 16, seq + 1, gen)
        out = model(input_ids=x[:, :-1])
        total += F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten()).item()
    model.train()
    return total / batches


def stage_target(work: Path, args: argparse.Namespace) -> None:
    from transformers import Qwen3ForCausalLM

    final = work / "target_final"
    if (final / "model.safetensors").exists():
        return
    if args.init_from is not None:          # keep a released bundle's target (and its statistics)
        model = Qwen3ForCausalLM.from_pretrained(args.init_from / "target", attn_implementation="sdpa")
        model.save_pretrained(final)
        stats_file = args.init_from / "training_stats.json"
        stats = json.loads(stats_file.read_text()).get("target", {}) if stats_file.exists() else {}
        (work / "target_stats.json").write_text(json.dumps({**stats, "kept_from": str(args.init_from)}, indent=1))
        log(f"target: kept from {args.init_from / 'target'}")
        return
    data = load_data(work)
    tokenizer_vocab = json.loads((work / "tokenizer.json").read_text())["model"]["vocab"]
    vocab = max(len(tokenizer_vocab) + len(SPECIAL_TOKENS), args.vocab)
    torch.manual_seed(0)
    config = target_config(vocab, args)
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt_path = work / "target_ckpt.pt"
    state = resume(ckpt_path, "target", {"model": model}, opt)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params / 1e6:.2f}M parameters, vocab {vocab}")
    gen = torch.Generator().manual_seed(state["step"] + 1)
    train = data["train"]
    model.train()
    for t0, lr, bar in budget_steps("target", args.target_minutes, args.target_lr, 100, state,
                                    lambda: save_checkpoint(ckpt_path, {"model": model}, opt, state)):
        x = random_windows(train, args.batch, args.seq + 1, gen)
        out = model(input_ids=x[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
        optimizer_step(opt, loss, model.parameters(), lr, state, t0, bar)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % 250 == 0:
            val = eval_target(model, data["validation"], args.seq)
            state["history"].append((state["step"], loss.item(), val))
            log(f"target step {state['step']}: train {loss.item():.3f} validation {val:.3f}")
    val = eval_target(model, data["validation"], args.seq, batches=32)
    state["final_validation_loss"] = val
    log(f"target done: validation loss {val:.4f} after {state['elapsed'] / 60:.1f} min")
    model.eval()
    model.save_pretrained(final)
    (work / "target_stats.json").write_text(json.dumps(state, indent=1))


def load_target(work: Path):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(work / "target_final", attn_implementation="sdpa")
    return model.eval().float().requires_grad_(False)
