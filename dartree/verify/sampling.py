"""Samplers: one token per scored position from warped target logits, ``sample(logits, positions) -> tokens``.

:class:`GeneratorSampler` draws from a ``torch.Generator``; :class:`KeyedSampler`'s Gumbel noise is a pure function
of ``(seed, absolute position, token id)``, so speculative decoding reproduces AR sampling token for token.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch import Tensor

from dartree.arguments import check_number, plain_scalar
from dartree.protocols import Sampler

__all__ = ["Sampler", "GeneratorSampler", "KeyedSampler", "hash32", "MIN_TEMPERATURE", "MAX_TEMPERATURE",
           "check_temperature", "sample_checked", "inverse_cdf"]

#: The smallest temperature > 0 accepted.  Below it ``logits / T`` leaves float32's range for
#: ordinary logits (a Python float under ~1e-38 even rounds to 0 in float32, so every logit becomes
#: +-inf and the draw is the lowest token id, not the greedy one) and nothing is gained: at 1e-6 a
#: logit gap of 1e-4 is already e^100 in probability, i.e. greedy up to exact ties.
MIN_TEMPERATURE = 1e-6
#: the largest temperature: above it ``logits / T`` in float32 ties (or underflows to 0), so top-k would keep
#: every tied token and the law would no longer be the target's at any useful precision
MAX_TEMPERATURE = 1e4

_MASK32 = 0xFFFFFFFF


def check_temperature(temperature: Any) -> float:
    """The temperature as a float: ``0`` (greedy) or a number in ``[MIN_TEMPERATURE, MAX_TEMPERATURE]``, else a
    ``ValueError`` naming the allowed values (a tiny positive one is refused, not taken as greedy)."""
    temperature = plain_scalar(temperature)
    # <= float's largest: refuses NaN, inf, and an int past float's range (math.isfinite would overflow on it)
    check_number("temperature", temperature, lambda x: 0 <= x <= sys.float_info.max,
                 f"expected 0 (greedy) or a finite number >= {MIN_TEMPERATURE}")
    if temperature > MAX_TEMPERATURE:
        raise ValueError(f"temperature: {temperature!r} is above the largest allowed {MAX_TEMPERATURE:g} (logits / T "
                         f"would tie in float32: top-k would keep every tied token); allowed: 0 or "
                         f"{MIN_TEMPERATURE} <= temperature <= {MAX_TEMPERATURE:g}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature: {temperature!r} is below the smallest allowed {MIN_TEMPERATURE} (logits / T "
                         f"would overflow float32); use 0 for greedy decoding or a temperature >= {MIN_TEMPERATURE}")
    return float(temperature)


class GeneratorSampler:
    """Categorical sampling with a ``torch.Generator`` (``None``: torch's global generator).

    Each call consumes fresh randomness, so speculative and autoregressive runs agree in
    distribution, not token for token.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator

    def sample(self, logits: Tensor, positions: Tensor) -> Tensor:
        if self.generator is not None and self.generator.device != logits.device:
            raise ValueError(f"generator: on {self.generator.device}, logits on {logits.device}")
        # perf: the inverse CDF, not torch.multinomial (several times slower on the CPU; every AR step draws)
        return inverse_cdf(torch.softmax(logits.float(), dim=-1), self.generator)[..., 0]


def inverse_cdf(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row by the inverse CDF in float64, one uniform per row: the first token whose cumulative mass
    exceeds ``u * total``, a point kept below the total (``u * total`` may round up to it), so never a token of
    mass 0.  Shape: float ``[..., V]`` (need not sum to 1) -> int64 ``[..., 1]``."""
    u = torch.rand((*probs.shape[:-1], 1), generator=generator, dtype=torch.float64, device=probs.device)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[..., -1:]
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True)


def _mul32_(x: Tensor, c: int) -> Tensor:
    """``x = (x * c) mod 2**32`` in place for ``0 <= x < 2**32`` held in int64, without int64 overflow: with
    ``c = hi * 2**16 + lo``, ``x * lo`` and ``x * hi`` stay below ``2**48`` and only the low 16 bits of ``x * hi``
    survive the shift."""
    low = x * (c & 0xFFFF)
    x.mul_(c >> 16).bitwise_and_(0xFFFF).bitwise_left_shift_(16).add_(low)
    return x.bitwise_and_(_MASK32)


def _fmix32_(x: Tensor) -> Tensor:
    """The murmur3 32-bit finaliser in place on int64 values in ``[0, 2**32)``."""
    x.bitwise_xor_(x >> 16)
    _mul32_(x, 0x85EBCA6B)
    x.bitwise_xor_(x >> 13)
    _mul32_(x, 0xC2B2AE35)
    return x.bitwise_xor_(x >> 16)


def hash32(x: Tensor) -> Tensor:
    """The murmur3 32-bit finaliser on int64 tensors holding values in ``[0, 2**32)``.

    Pure integer arithmetic that never overflows int64, so every device gives the same bits.
    """
    return _fmix32_(x & _MASK32)


def fmix32(x: int) -> int:
    """:func:`hash32` of one Python int."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=8)
def _token_keys(vocab_size: int, device: torch.device) -> Tensor:
    """int64 ``[V]``: each token's term of the keyed hash, ``(token + 1) * 0x27D4EB2F mod 2**32`` (the same for
    every seed and position: made once per vocabulary size and device)."""
    return _mul32_(torch.arange(1, vocab_size + 1, device=device, dtype=torch.int64), 0x27D4EB2F)


#: perf (CPU): at most this many positions are hashed in Python (one host read of the positions) rather than by
#: two hashes of tiny tensors, a few microseconds of dispatch per op
_HOST_POSITIONS = 64


class KeyedSampler:
    """Gumbel-max sampling whose noise is a pure function of (seed, absolute position, token id).

    ``u = (hash(seed, position, token) >> 8 + 0.5) / 2**24`` is exact in float32 and identical on
    every device; the Gumbel noise ``-log(-log(u))`` is computed in float64 (CPU and CUDA ``log``
    agree to the last bit in practice; the uniform bits agree exactly).  The hash:
    ``fmix32(fmix32(key ^ fmix32(position)) ^ (token + 1) * 0x27D4EB2F)`` with
    ``key = fmix32(seed) ^ fmix32((seed >> 32) + 0x9E3779B9)`` (32-bit arithmetic).

    Shape:
        logits:    float ``[..., V]`` already divided by the temperature.
        positions: int64 ``[...]``.
        returns:   int64 ``[...]`` ``argmax(logits + gumbel(seed, position, token))``.
    """

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed: expected an int in [0, 2**63), got {seed!r}")
        self.seed = seed
        self._key = fmix32(seed) ^ fmix32((seed >> 32) + 0x9E3779B9)

    def noise(self, positions: Tensor, vocab_size: int) -> Tensor:
        """float64 ``[..., V]``: the Gumbel noise of every token at each position."""
        if positions.dtype != torch.int64:
            raise ValueError(f"positions: expected int64, got {positions.dtype}")
        device = positions.device
        if device.type == "cpu" and positions.numel() <= _HOST_POSITIONS:
            key = self._key
            rows = torch.tensor([fmix32(key ^ fmix32(p)) for p in positions.reshape(-1).tolist()],
                                dtype=torch.int64).reshape(*positions.shape, 1)
        else:
            rows = hash32(_fmix32_(positions[..., None] & _MASK32).bitwise_xor_(self._key))
        h = _fmix32_(rows ^ _token_keys(vocab_size, device)).bitwise_right_shift_(8)
        u = h.to(torch.float64).add_(0.5).div_(float(1 << 24))
        return u.log_().neg_().log_().neg_()

    def sample(self, logits: Tensor, positions: Tensor) -> Tensor:
        if positions.shape != logits.shape[:-1]:
            raise ValueError(f"positions: shape {tuple(positions.shape)} must equal logits' leading shape "
                             f"{tuple(logits.shape[:-1])}")
        positions = positions.to(logits.device)
        if positions.device.type == "cpu" and positions.numel() > 1:
            # Tree nodes of one depth share a position, so a tree of n nodes has about gamma distinct
            # positions: hash each once (the noise is a pure function of the position, so the result
            # is the same bits).  Not on accelerators: unique() would read its size back to the host.
            unique, index = torch.unique(positions, return_inverse=True)
            if unique.numel() < positions.numel():
                return torch.argmax(self.noise(unique, logits.shape[-1])[index].add_(logits), dim=-1)
        return torch.argmax(self.noise(positions, logits.shape[-1]).add_(logits), dim=-1)


_TRUSTED = (GeneratorSampler, KeyedSampler)


def sample_checked(sampler: Sampler, logits: Tensor, positions: Tensor) -> Tensor:
    """``sampler.sample(logits, positions)``, the one call site of a sampler.  A custom sampler's result must be
    integer ids in ``[0, V)`` of shape ``logits.shape[:-1]`` on ``logits``' device, else a ``ValueError`` naming
    the sampler (the range check is a host sync; the built-in samplers, exact types, are trusted).

    Shape: logits float ``[..., V]`` (warped); positions int64 ``[...]`` -> int64 ``[...]``.
    """
    out = sampler.sample(logits, positions)
    if type(sampler) in _TRUSTED:
        return out
    name = type(sampler).__name__
    if not isinstance(out, Tensor):
        raise ValueError(f"sampler: {name}.sample returned {type(out).__name__}, expected an int64 tensor of shape "
                         f"{list(logits.shape[:-1])} (one token id per position)")
    if out.dtype == torch.bool or out.is_floating_point() or out.is_complex():
        raise ValueError(f"sampler: {name}.sample returned a {out.dtype} tensor, expected integer token ids "
                         f"(int64)")
    if out.shape != logits.shape[:-1]:
        raise ValueError(f"sampler: {name}.sample returned shape {list(out.shape)}, expected "
                         f"{list(logits.shape[:-1])} (logits' leading shape: one id per position)")
    if out.device != logits.device:
        raise ValueError(f"sampler: {name}.sample returned a tensor on {out.device}, logits are on {logits.device}")
    vocab = logits.shape[-1]
    ids = out.to(torch.int64)    # compared in int64: in uint8 or int16, ``out >= vocab`` wraps the vocabulary size
    if ids.numel() and bool(((ids < 0) | (ids >= vocab)).any()):    # host sync: custom samplers only
        bad = ids[(ids < 0) | (ids >= vocab)].reshape(-1)[:4].tolist()
        raise ValueError(f"sampler: {name}.sample returned token ids {bad} outside the vocabulary [0, {vocab})")
    return ids
