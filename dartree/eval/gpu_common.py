"""What a GPU-check step is given and may raise (:mod:`dartree.eval.gpu_check` runs the steps of
:mod:`dartree.eval.gpu_steps`; both import this, so neither imports the other at load)."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["Check", "Skip"]


class Skip(Exception):
    """Raised by a step that cannot run here; its message is the reason ("needs CUDA")."""


class Check:
    """Settings shared by the steps and the step's own budget.

    device: ``cuda`` / ``cuda:N`` / ``cpu``.  quick: the quick pass (fewer sizes, fewer prompts).
    out: the report folder (steps may write scratch files there, never more report files).
    time_limit: seconds this step may take (its loops stop near it, :meth:`out_of_time`).
    cost_models / lossless_model: model shapes of :data:`dartree.eval.gpu_steps.MODEL_SHAPES` (``None``:
    the device's default, real sizes on CUDA, tiny ones on the CPU).  compile: also time
    ``torch.compile(mode="reduce-overhead")`` in the graphs step.
    """

    def __init__(self, device: str = "cuda", quick: bool = False, out: Path = Path("runs/gpu-check"),
                 time_limit: float | None = None, cost_models: list[str] | None = None,
                 lossless_model: str | None = None, compile: bool = False) -> None:
        import torch

        self.device = torch.device(device)
        self.quick = quick
        self.out = Path(out)
        self.start = time.monotonic()
        self.time_limit = time_limit
        self.cost_models = cost_models
        self.lossless_model = lossless_model
        self.compile = compile
        self.partial_file: Path | None = None   # where :meth:`checkpoint` keeps what is done (isolated steps)
        self.notes: list[str] = []        # what a step left out near its budget (status "partial")
        self.problems: list[str] = []     # what a step found wrong without raising (status "failed")

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def time_left(self) -> float:
        """Seconds left of this step's budget (infinite without one)."""
        if self.time_limit is None:
            return float("inf")
        return self.time_limit - (time.monotonic() - self.start)

    def out_of_time(self, need: float = 0.0, what: str = "") -> bool:
        """True (and noted, when ``what`` says what is left out) when less than ``need`` seconds are left."""
        if self.time_left() > need:
            return False
        if what:
            self.notes.append(f"left out near the step's time budget: {what}")
        return True

    def checkpoint(self, text: str) -> None:
        """Keep ``text`` (the step's tables so far): a step killed at its budget reports it."""
        if self.partial_file is not None:
            self.partial_file.write_text(text)

    def fail(self, problem: str) -> None:
        """Record something wrong (a lossless mismatch, say): the step ends "failed", its text kept."""
        self.problems.append(problem)
