"""What every training stage shares: the zoo's name and special tokens, logging, the learning-rate
schedule over a wall-clock budget, and one optimizer step with its budget bookkeeping."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

__all__ = ["ZOO_NAME", "SPECIAL_TOKENS", "log", "lr_at", "budget_steps", "optimizer_step", "resume", "save_checkpoint"]

ZOO_NAME = "pystdlib-tiny"
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def lr_at(step: int, frac: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10% over the time budget (``frac``: the
    fraction spent; the CPU is shared, so the schedule follows time, not a step count)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def budget_steps(stage: str, minutes: float, peak: float, warmup: int, state: dict,
                 save: Callable[[], None]) -> Iterator[tuple[float, float, tqdm]]:
    """The steps of a stage's wall-clock budget of ``minutes`` (a resumed ``state``'s time included): yields each
    step's start time, learning rate (:func:`lr_at`) and progress bar, for :func:`optimizer_step`; ``save()``
    writes the checkpoint every 5 minutes."""
    budget = minutes * 60.0
    bar = tqdm(desc=stage, initial=state["step"], mininterval=20)
    last_save = time.time()
    while state["elapsed"] < budget:
        yield time.time(), lr_at(state["step"], state["elapsed"] / budget, peak, warmup), bar
        if time.time() - last_save > 300:
            save()
            last_save = time.time()
    bar.close()


@torch.no_grad()
def optimizer_step(opt, loss: torch.Tensor, params, lr: float, state: dict, started: float, bar) -> None:
    """One clipped optimizer step at learning rate ``lr``, plus the step / wall-clock budget bookkeeping
    shared by every stage (``state`` holds ``step`` and ``elapsed``; ``started`` is the step's start time).
    ``params``: one list of parameters clipped together, or a list of such lists, each clipped on its own
    (models trained side by side that share nothing)."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = list(params)
    for clipped in (params if params and isinstance(params[0], list) else [params]):
        torch.nn.utils.clip_grad_norm_(clipped, 1.0)
    opt.step()
    state["step"] += 1
    state["elapsed"] += time.time() - started
    bar.update(1)


def resume(path: Path, stage: str, modules: dict[str, torch.nn.Module], opt) -> dict:
    """The training state of ``stage``: fresh, or restored from its checkpoint ``path`` when one exists
    (then ``modules`` and ``opt`` are loaded in place).  The state holds ``step``, ``elapsed`` and ``history``."""
    if not path.exists():
        return {"step": 0, "elapsed": 0.0, "history": []}
    ck = torch.load(path, weights_only=False)
    for key, module in modules.items():
        module.load_state_dict(ck[key])
    opt.load_state_dict(ck["opt"])
    state = ck["state"]
    log(f"{stage}: resumed at step {state['step']}, {state['elapsed'] / 60:.1f} min done")
    return state


def save_checkpoint(path: Path, modules: dict[str, torch.nn.Module], opt, state: dict) -> None:
    """What :func:`resume` reads: each module's weights under its key, the optimizer and the state."""
    torch.save({**{key: m.state_dict() for key, m in modules.items()}, "opt": opt.state_dict(), "state": state}, path)
