"""Peer decoders, the decoding loops dartree does not own, timed on the same models and prompts: ``hf-generate``
(transformers' greedy ``generate``), ``hf-prompt-lookup`` (its n-gram speculative decoding) and ``dflash`` (z-lab's
``dflash_generate`` on the bundle's drafter exported in their layout; an optional extra:
``pip install --no-deps dflash==0.1.0``).  Every peer returns a :class:`PeerResult`; at T>0 the HF peers sample
(``do_sample``, the run's warpers, HF's own sampler seeded per call), ``dflash`` decodes greedily only.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from dartree.eval.bundles import Bundle
from dartree.verify.warp import Warp

__all__ = ["PEERS", "PEER_PREFIX", "PeerResult", "PeerDecoder", "peer_unavailable", "make_peer"]

#: Peer names, in the order the tables show them.
PEERS: tuple[str, ...] = ("hf-generate", "hf-prompt-lookup", "dflash")
#: HF prompt lookup's proposal length (transformers' own default is 10; 5 measured better on the zoo's code).
PROMPT_LOOKUP_TOKENS = 5

#: How tables label a peer: ``peer:NAME``.
PEER_PREFIX = "peer:"


@dataclass(frozen=True)
class PeerResult:
    """A peer's decode.  Shape: tokens int64 ``[1, m]`` (new tokens only)."""

    tokens: Tensor
    committed: tuple[int, ...] | None = None     # tokens committed per round, when the peer reports them


PeerDecoder = Callable[[Tensor, int], PeerResult]     # (input_ids [1, L], max_new_tokens) -> result


def peer_unavailable(name: str, bundle: Bundle | None = None, warp: Warp | None = None) -> str | None:
    """Why peer ``name`` cannot run (on ``bundle``, sampling with ``warp``: ``None`` greedy), or ``None``."""
    if name not in PEERS:
        raise ValueError(f"peer: must be one of {PEERS}, got {name!r}")
    if name == "dflash" and warp is not None:
        return "dflash_generate is timed greedy only (T=0)"
    if name == "dflash":
        if importlib.util.find_spec("dflash") is None:
            return "the dflash package is not installed (pip install --no-deps dflash==0.1.0)"
        if bundle is not None and not hasattr(bundle.drafter, "config"):
            return f"the bundle's drafter ({type(bundle.drafter).__name__}) is not a DFlash drafter"
        if bundle is not None and getattr(bundle.drafter.config, "shift_label", False):
            return "dflash_generate reads slot 0 as the root: a shift_label (DSpark-layout) drafter does not fit it"
    if bundle is not None and not callable(getattr(bundle.target, "generate", None)):
        return f"the target ({type(bundle.target).__name__}) has no generate()"
    return None


def make_peer(name: str, bundle: Bundle, prompt_lookup_tokens: int = PROMPT_LOOKUP_TOKENS, warp: Warp | None = None,
              seed: int = 0) -> PeerDecoder:
    """A decoder of peer ``name`` on ``bundle``'s target (and drafter, for ``dflash``): greedy, or with ``warp``
    HF's sampling at its temperature, top-k, top-p and min-p (HF's default top-k 50 off; warpers the model's own
    ``generation_config`` sets still apply, as at T=0); sampling call ``i`` seeds the default generator of the
    prompt's device with ``seed`` and ``i`` (HF's sampler draws from it), restored after."""
    reason = peer_unavailable(name, bundle, warp)
    if reason is not None:
        raise ValueError(f"peer: {name} cannot run: {reason}")
    target = bundle.target
    pad = getattr(target.generation_config, "pad_token_id", None)
    pad = 0 if pad is None else pad

    if name in ("hf-generate", "hf-prompt-lookup"):
        extra = {"prompt_lookup_num_tokens": prompt_lookup_tokens} if name == "hf-prompt-lookup" else {}
        if warp is not None:
            extra.update(temperature=warp.temperature, top_k=warp.top_k or 0,       # Warp's top_k is None or >= 1
                         top_p=1.0 if warp.top_p is None else warp.top_p, min_p=warp.min_p)
        calls = [0]

        @torch.no_grad()
        def hf(input_ids: Tensor, max_new_tokens: int) -> PeerResult:
            # min_new_tokens: the comparison needs exactly max_new_tokens (no early stop at eos)
            run = lambda: target.generate(input_ids, attention_mask=torch.ones_like(input_ids),  # noqa: E731
                                          do_sample=warp is not None, max_new_tokens=max_new_tokens,
                                          min_new_tokens=max_new_tokens, pad_token_id=pad, **extra)
            if warp is None:
                return PeerResult(run()[:, input_ids.shape[1]:])
            # HF draws from the default generator of the logits' device: that one seeded, and restored after
            device = input_ids.device
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                key = (seed * 1_000_003 + calls[0]) % 2**64
                calls[0] += 1
                if device.type == "cuda":
                    with torch.cuda.device(device):
                        torch.cuda.manual_seed(key)
                else:
                    torch.random.default_generator.manual_seed(key)
                out = run()
            return PeerResult(out[:, input_ids.shape[1]:])

        return hf

    from dflash import DFlashDraftModel
    from dflash.model import dflash_generate

    from dartree.models.writers import save_drafter

    device = next(target.parameters()).device
    with tempfile.TemporaryDirectory(prefix="dartree-dflash-") as tmp:     # the drafter in z-lab's layout, loaded back
        path = save_drafter(bundle.drafter, Path(tmp) / "dflash-drafter")
        model = DFlashDraftModel.from_pretrained(str(path), dtype=bundle.drafter.fc.weight.dtype).to(device).eval()
    cuda = device.type == "cuda"

    def dflash(input_ids: Tensor, max_new_tokens: int) -> PeerResult:
        # return_stats gives its acceptance lengths (tokens per round after the prefill's first one), but
        # its clocks call torch.cuda.synchronize(), which a CPU-only torch refuses: on the CPU, no rounds
        out = dflash_generate(model, target, input_ids, max_new_tokens, stop_token_ids=None, temperature=0.0,
                              return_stats=cuda)
        if not cuda:
            return PeerResult(out[:, input_ids.shape[1]:])
        return PeerResult(out.output_ids[:, input_ids.shape[1]:], tuple(int(a) for a in out.acceptance_lengths))

    return dflash
