"""Ahead-of-time compilation of the Triton kernels for CUDA targets, on any machine (no GPU needed): CI's tool
(tests/fast/test_triton_compile.py), not the library's, so it lives with the tests.

A :class:`~dartree.fast.triton_kernels.Launch` recorded by ``record_launches`` becomes what Triton's JIT would
compile on a GPU, compiled by ``triton.compile`` down to a cubin in a subprocess without ``TRITON_INTERPRET``.
``python -m tests.fast.triton_compile`` compiles the largest supported shapes for sm_80, sm_89 and sm_90 and
prints the table of docs/kernels.md ("Compiling for GPUs").
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from triton.runtime.jit import JITFunction

from dartree.fast import triton_kernels
from dartree.fast.triton_kernels import Launch, record_launches

__all__ = ["ARCHS", "Compiled", "compile_launch", "compile_all", "largest_launches", "distinct", "main"]

ARCHS: tuple[int, ...] = (80, 89, 90)


@dataclass(frozen=True)
class Compiled:
    """One kernel specialisation compiled for one architecture."""

    kernel: str
    arch: int
    seconds: float      # wall clock
    cpu_seconds: float  # this process and its children (ptxas): steadier than wall on a busy machine
    shared: int        # bytes of shared memory the kernel needs (Triton's metadata)
    num_warps: int
    cubin_bytes: int
    fma_f32: int = 0    # fused float32 multiply-adds in the PTX (0 where a kernel turns fp fusion off)


def _kernel(name: str):
    kernel = getattr(triton_kernels, name)
    if not isinstance(kernel, JITFunction):
        raise RuntimeError("the kernels were defined under TRITON_INTERPRET=1 (interpreter functions, and so are "
                           "triton.language's own helpers): use compile_all, which compiles in a subprocess")
    return kernel


@contextlib.contextmanager
def _fresh_cache() -> Iterator[None]:
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="dartree-triton-") as tmp:
        old_dir, old_always = knobs.cache.dir, knobs.compilation.always_compile
        knobs.cache.dir, knobs.compilation.always_compile = tmp, True
        try:
            yield
        finally:
            knobs.cache.dir, knobs.compilation.always_compile = old_dir, old_always


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def compile_launch(launch: Launch, arch: int) -> Compiled:
    """Compile the specialisation ``launch`` needs for ``sm_<arch>``; raises if Triton or ptxas fails."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = _kernel(launch.kernel)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(launch.constexprs, num_warps=launch.num_warps)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    with _fresh_cache():
        start, cpu = time.perf_counter(), _cpu_seconds()
        out = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    return Compiled(kernel=launch.kernel, arch=arch, seconds=seconds, cpu_seconds=cpu, shared=int(out.metadata.shared),
                    num_warps=int(out.metadata.num_warps), cubin_bytes=len(out.asm["cubin"]),
                    fma_f32=out.asm["ptx"].count("fma.rn.f32"))


def distinct(launches: Iterable[Launch]) -> list[Launch]:
    """One launch per compiled variant (kernel, argument types, constexprs, warps), in first-seen order."""
    seen: dict[tuple, Launch] = {}
    for launch in launches:
        seen.setdefault(launch.key(), launch)
    return list(seen.values())


def largest_launches() -> list[Launch]:
    """The launches of the largest sizes the fast path supports, recorded on ``meta`` tensors (nothing runs):
    batch 32, gamma 32, vocabulary 262144 (fp32, bf16, fp16), every limit of ``LIMITS``, and the chain's width 1."""
    tk, lim, meta = triton_kernels, triton_kernels.LIMITS, torch.device("meta")
    b, gamma, vocab = 32, 32, 262144

    def zeros(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=meta)

    with record_launches(execute=False) as launches:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            tk.topk_candidates(zeros(b, gamma, vocab, dtype=dtype), lim["topk"], True)
        tk.topk_candidates(zeros(b, gamma, vocab), 1, False)
        tk.depth_step(zeros(b, 256), zeros(b, 256, lim["topk"]), 0.0, lim["width"])
        tk.depth_step(zeros(b, 1), zeros(b, 1, lim["topk"]), 0.0, 1)
        tk.top_b(zeros(b, 8192), lim["budget"])
        for n in (257, lim["nodes"]):
            nodes = zeros(b, n, dtype=torch.int64)
            tk.tree_structure(nodes, zeros(b, dtype=torch.int64), 0)
            tk.greedy_walk(nodes, nodes, zeros(b, dtype=torch.int64), nodes)
    return launches


def compile_all(launches: list[Launch], archs: Iterable[int] = ARCHS,
                workers: int | None = None) -> list[tuple[Launch, Compiled]]:
    """Compile every launch for every arch in ``workers`` subprocesses (default: up to 4) without
    TRITON_INTERPRET; RuntimeError with the compiler's message on the first failure (or without ptxas)."""
    jobs = [(launch, arch) for launch in launches for arch in archs]
    workers = workers or min(4, os.cpu_count() or 1)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, stated (silences its warning)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(triton_kernels.__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory(prefix="dartree-aot-") as tmp:
        procs = []
        for w in range(max(1, min(workers, len(jobs)))):
            src, dst = os.path.join(tmp, f"jobs{w}.pkl"), os.path.join(tmp, f"out{w}.pkl")
            with open(src, "wb") as f:
                pickle.dump(jobs[w :: min(workers, len(jobs))], f)
            cmd = [sys.executable, "-m", "tests.fast.triton_compile", "--worker", src, dst]
            procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                          dst))
        results: list[Compiled | None] = [None] * len(jobs)
        try:
            for w, (proc, dst) in enumerate(procs):
                log = proc.communicate()[0]
                if proc.returncode != 0:
                    raise RuntimeError(f"Triton ahead-of-time compilation failed:\n{log[-6000:]}")
                with open(dst, "rb") as f:
                    results[w :: len(procs)] = pickle.load(f)
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return [(launch, compiled) for (launch, _), compiled in zip(jobs, results, strict=True)]


def _worker(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        jobs = pickle.load(f)
    results = []
    for launch, arch in jobs:
        print(f"compiling {launch.kernel} {dict(launch.constexprs)} for sm_{arch}", flush=True)
        results.append(compile_launch(launch, arch))
    with open(dst, "wb") as f:
        pickle.dump(results, f)


def table(pairs: list[tuple[Launch, Compiled]]) -> str:
    """Markdown: one row per (specialisation, arch)."""
    rows = ["| kernel | input | constexprs | warps | arch | compiled | CPU time (s) | shared memory (bytes) |",
            "|---|---|---|---|---|---|---|---|"]
    for launch, r in pairs:
        consts = ", ".join(f"{k}={v}" for k, v in launch.constexprs if not k.startswith("LOG_"))
        dtype = str(launch.args[0].dtype).removeprefix("torch.")
        rows.append(f"| `{r.kernel}` | {dtype} | {consts} | {r.num_warps} | sm_{r.arch} | yes | {r.cpu_seconds:.1f} "
                    f"| {r.shared} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """``--worker JOBS OUT``: compile pickled jobs (used by :func:`compile_all`); otherwise compile the
    largest supported shapes for every arch and print the markdown table (fails on the first error)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1], argv[2])
        return
    start = time.perf_counter()
    pairs = compile_all(distinct(largest_launches()))
    print(table(pairs))
    print(f"\n{len(pairs)} compilations, {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    from tests.fast.triton_compile import main as _main  # pickled results must name the real module

    _main()
