"""``make gpu-check``: everything that needs a GPU, in one command, with one markdown report.

    python -m dartree.eval.gpu_check --out runs/gpu-check/report.md           # on a machine with CUDA
    python -m dartree.eval.gpu_check --device cpu --quick --out /tmp/r.md     # the same code paths, tiny, on CPU

Steps, in order; the first that fails stops the run with a non-zero exit and its traceback in the
report (nothing is caught and reported as a number):

1. the test suite's kernel and verification tests (``tests/fast``, ``tests/verify``): on a CUDA
   machine ``tests/fast/test_fast_kernels.py`` runs the compiled kernels on CUDA (tests/conftest.py
   sets ``TRITON_INTERPRET=1`` only without CUDA) and ``test_triton_compile`` compiles ahead of time;
2. parity of every builder with ``ref``: fast on the device through the Triton kernels and through
   the torch twins, against ref on the CPU (integers exact; scores exact with ``normalize="candidates"``);
3. lossless fp32 decoding on the zoo on the device, every method against AR token for token (this
   also checks KV-cache compaction on the device: every round compacts the cache to the accepted path);
4. the builder benchmark grid, providers ref / fast (torch twins) / fast (Triton), medians;
5. the demo bench (``dartree bench --preset demo``) with the zoo moved to the device;
6. bf16 vs fp32 argmax divergence of the zoo target per 1000 tokens (teacher-forced on fp32 greedy text).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from dartree.eval.outdir import write_atomic

__all__ = ["main", "STEPS"]

BUILDER_CONFIGS: dict[str, dict] = {
    "chain": {}, "corrected-chain": {}, "ddtree": {"budget": 32}, "corrected-chain-ddtree": {"budget": 32},
    "sequential-heap": {"budget": 16}, "dartree-fixed": {"budget": 32}, "dartree-pruned": {"budget": 32, "width": 8},
    "sequoia": {"budget": 32}, "corrected-sequoia": {"budget": 32},
}


class Check:
    """Settings shared by the steps: device, size (quick = tiny, for the CPU dry run), output folder."""

    def __init__(self, device: str, quick: bool, out: Path) -> None:
        self.device = torch.device(device)
        self.quick = quick
        self.out = out

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _head_for(name: str):
    from dartree import make_builder
    from dartree.testing import PathHashHead

    return PathHashHead() if make_builder(name).needs_head else None


# ------------------------------------------------------------------------------------------ steps
def step_tests(c: Check) -> str:
    """pytest on tests/fast and tests/verify, with every Triton specialisation compiled for every arch
    (``-m "aot_full or not aot_full"``: the default suite compiles the test shapes for one arch only)
    (quick: the dispatch test only)."""
    args = ["tests/fast", "tests/verify", "-m", "aot_full or not aot_full"] if not c.quick else [
        "tests/fast/test_fast_kernels.py", "-k", "dispatch"]
    cmd = [sys.executable, "-m", "pytest", *args, "-x", "-q", "-p", "no:cacheprovider", "--benchmark-disable"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    if proc.returncode != 0:
        raise RuntimeError(f"pytest failed ({' '.join(cmd)}):\n" + (proc.stdout + proc.stderr)[-4000:])
    return f"`{' '.join(cmd[1:])}`: " + " / ".join(tail)


def step_parity(c: Check) -> str:
    """Every builder, fast on the device (Triton and torch twins) == ref on the CPU."""
    from dartree import BUILDERS, DraftBlock, make_builder
    from dartree.fast import ops

    fields = ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")
    shapes = [(3, 4, 111, True), (2, 6, 1000, False)] if c.quick else [(3, 8, 32000, False), (4, 16, 4096, True),
                                                                           (1, 16, 151936, False)]
    backends = ["torch"] + (["triton"] if c.device.type == "cuda" else [])
    rows = []
    for b, gamma, vocab, ties in shapes:
        g = torch.Generator().manual_seed(vocab)
        logits = (torch.randint(0, 4, (b, gamma, vocab), generator=g).float() if ties
                  else torch.randn(b, gamma, vocab, generator=g) * 2)
        block = DraftBlock(logits=logits, root=torch.randint(0, vocab, (b,), generator=g))
        on_device = DraftBlock(logits=logits.to(c.device), root=block.root.to(c.device))
        for name in BUILDERS:
            cfg = {"topk": 8, "normalize": "candidates", **BUILDER_CONFIGS[name]}
            head = _head_for(name)
            ref = make_builder(name, backend="ref", **cfg).build(block, head)
            for kernels in backends:
                with ops.force_backend(kernels):
                    fast = make_builder(name, backend="fast", **cfg).build(on_device, head).to("cpu")
                bad = [f for f in fields if not torch.equal(getattr(ref, f), getattr(fast, f))]
                if bad:
                    raise AssertionError(f"{name} [{b},{gamma},{vocab}] fast/{kernels} on {c.device} != ref: {bad}")
                rows.append([name, f"[{b}, {gamma}, {vocab}]", kernels, "equal"])
    return _table(["builder", "block", "kernels", "vs ref (all fields, exact)"], rows)


def _zoo(c: Check):
    from dartree.eval.bundles import load_bundle, tiny_random_bundle

    bundle = tiny_random_bundle() if c.quick else load_bundle("pystdlib-tiny")
    return _to_device(bundle, c.device)


def _to_device(bundle, device: torch.device):
    return bundle.to(device)


def step_lossless(c: Check) -> str:
    """Greedy fp32 decoding on the device equals AR, for every method (KV compaction included)."""
    from dartree.decode import generate_ar
    from dartree.eval.bundles import encode
    from dartree.eval.methods import make_decoder, parse_method
    from dartree.models.target import HFTarget

    bundle = _zoo(c)
    prompts = ["def parse_args(argv):\n", "import os\n\nclass Cache:\n"][: 1 if c.quick else 2]
    new = 16 if c.quick else 96
    methods = ["chain", "ddtree", "corrected-chain", "corrected-chain-ddtree", "sequential-heap", "dartree-fixed",
               "dartree-pruned", "sequoia", "corrected-sequoia"]
    rows = []
    for text in prompts:
        ids = torch.tensor(encode(bundle.tokenizer, text), dtype=torch.int64, device=c.device)
        ar = generate_ar(HFTarget(bundle.target), ids, new).sequence.cpu()
        for name in methods:
            method = parse_method(name, {"budget": 16} if name not in ("chain", "corrected-chain") else {})
            result = make_decoder(bundle, method, "fast").generate(ids, new)
            same = torch.equal(result.sequence.cpu(), ar)
            if not same:
                raise AssertionError(f"{name} on {c.device} is not lossless for prompt {text!r}")
            rows.append([name, repr(text[:20]), result.num_rounds, f"{result.tau:.2f}", "identical"])
    return _table(["method", "prompt", "rounds", "tau", "vs AR"], rows)


def step_bench_grid(c: Check) -> str:
    """Build latency medians: ref / fast (torch twins) / fast (Triton) on the device."""
    from dartree import DraftBlock, make_builder
    from dartree.fast import ops

    vocabs = [1000] if c.quick else [32000, 151936]
    names = ["chain", "ddtree", "dartree-fixed", "dartree-pruned"] if c.quick else list(BUILDER_CONFIGS)
    repeat = 3 if c.quick else 20
    providers = [("ref", "ref", None), ("fast (torch)", "fast", "torch")]
    if c.device.type == "cuda":
        providers.append(("fast (Triton)", "fast", "triton"))
    rows = []
    for vocab in vocabs:
        g = torch.Generator().manual_seed(0)
        block = DraftBlock(logits=(torch.randn(1, 16, vocab, generator=g) * 2).to(c.device),
                           root=torch.zeros(1, dtype=torch.int64, device=c.device))
        for name in names:
            cfg = {"topk": 64 if not c.quick else 8, **BUILDER_CONFIGS[name]}
            head = _head_for(name)
            row = [name, vocab]
            for _, backend, kernels in providers:
                builder = make_builder(name, backend=backend, **cfg)
                with ops.force_backend(kernels) if kernels else _nothing():
                    builder.build(block, head)  # warm-up (kernel compilation)
                    times = []
                    for _ in range(repeat if backend == "fast" else max(1, repeat // 4)):  # ref: slow, few runs
                        c.sync()
                        start = time.perf_counter()
                        builder.build(block, head)
                        c.sync()
                        times.append(time.perf_counter() - start)
                row.append(f"{statistics.median(times) * 1e3:.2f}")
            rows.append(row)
    return _table(["builder", "V", *[f"{label} ms" for label, _, _ in providers]], rows)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def step_demo_bench(c: Check) -> str:
    """``dartree bench --preset demo --device DEVICE``: the main job, on the device."""
    out = c.out.parent / "demo-bench"
    argv = ["bench", "--preset", "demo", "--out", str(out), "--force", "--strict", "--device", str(c.device)]
    if c.quick:
        argv = ["bench", "--model", "tiny-random", "--methods", "chain", "ddtree", "--datasets", "stdlib",
                "--num-prompts", "1", "--max-new-tokens", "8", "--no-warmup", "--out", str(out), "--force",
                "--strict", "--device", str(c.device)]
    # the command line as a user runs it, in its own process (dartree.cli sits above dartree.eval: no import)
    status = subprocess.run([sys.executable, "-m", "dartree.cli", *argv], check=False).returncode
    if status != 0:
        raise RuntimeError(f"dartree {' '.join(argv)} exited with {status}")
    return f"`dartree {' '.join(argv)}` on {c.device}:\n\n" + (out / "results.md").read_text()


def step_bf16_divergence(c: Check) -> str:
    """Argmax differences of the target in bf16 vs fp32, per 1000 teacher-forced tokens."""
    from dartree.decode import generate_ar
    from dartree.eval.bundles import encode
    from dartree.eval.datasets import load_prompts
    from dartree.models.target import HFTarget

    bundle = _zoo(c)
    fp32 = bundle.target
    prompts = [p.text for p in load_prompts("stdlib", 1 if c.quick else 8)]
    new = 16 if c.quick else 128
    positions = differ = 0
    for text in prompts:
        ids = torch.tensor(encode(bundle.tokenizer, text)[-256:], dtype=torch.int64, device=c.device)
        seq = generate_ar(HFTarget(fp32), ids, new).sequence.reshape(1, -1)
        with torch.no_grad():
            a = fp32(seq).logits[0, ids.numel() - 1: -1].argmax(-1)
            fp32.to(torch.bfloat16)
            try:
                b = fp32(seq).logits[0, ids.numel() - 1: -1].argmax(-1)
            finally:
                fp32.to(torch.float32)
        positions += a.numel()
        differ += int((a != b).sum())
    rate = 1000.0 * differ / positions
    return _table(["tokens compared", "argmax differs", "per 1000 tokens"], [[positions, differ, f"{rate:.1f}"]])


STEPS: list[tuple[str, Callable[[Check], str]]] = [
    ("Test suite (kernels, verification)", step_tests),
    ("Parity with ref on the device", step_parity),
    ("Lossless fp32 decoding on the zoo", step_lossless),
    ("Builder benchmark grid", step_bench_grid),
    ("Demo bench", step_demo_bench),
    ("bf16 vs fp32 argmax divergence", step_bf16_divergence),
]


def _header(c: Check) -> str:
    import transformers
    import triton

    device = torch.cuda.get_device_name(c.device) if c.device.type == "cuda" else platform.processor() or "cpu"
    cap = ".".join(map(str, torch.cuda.get_device_capability(c.device))) if c.device.type == "cuda" else "-"
    return (f"# GPU check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            + _table(["device", "capability", "torch", "CUDA", "triton", "transformers", "python", "mode"],
                     [[device, cap, torch.__version__, torch.version.cuda or "-", triton.__version__,
                       transformers.__version__, platform.python_version(), "quick" if c.quick else "full"]]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dartree.eval.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run of the same code paths)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and a tiny model (for the CPU dry run)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check/report.md"))
    p.add_argument("--steps", nargs="+", choices=[f.__name__[5:] for _, f in STEPS], help="run only these steps")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch (use --device cpu for a dry run)")
    c = Check(args.device, args.quick, args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sections = [_header(c)]
    status = 0
    for title, fn in STEPS:
        if args.steps and fn.__name__[5:] not in args.steps:
            continue
        start = time.perf_counter()
        print(f"[gpu-check] {title} ...", flush=True)
        try:
            body = fn(c)
        except (Exception, SystemExit):   # SystemExit: a step's CLI call refusing its arguments (UsageError)
            sections.append(f"## {title}: FAILED\n\n```\n{traceback.format_exc()}```")
            print(sections[-1], file=sys.stderr)
            status = 1
            break
        sections.append(f"## {title} ({time.perf_counter() - start:.0f} s)\n\n{body}")
    write_atomic(args.out, "\n\n".join(sections) + "\n")     # the report is whole or the earlier one stays
    print(f"[gpu-check] {'FAILED' if status else 'passed'}; report: {args.out}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
