"""Tuning results cached per model and machine (``tune.json`` in the user's cache folder), so that ``dartree
generate`` decodes with the tree that pays here (docs/internals.md, "The benchmark harness")."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from dartree.eval.bundles import Bundle
from dartree.eval.methods import AUTO, SEARCHED_WHEN_UNSET, MethodSpec
from dartree.eval.outdir import write_atomic

__all__ = ["CACHE_FILE", "DEVICE_DEFAULT_BUDGET", "cache_dir", "model_hash", "machine", "cache_key", "lookup", "store",
           "store_or_warn", "entry_of", "tune_hint", "check_cached", "resolve_unset"]

CACHE_FILE = "tune.json"
_VERSION = 1


def cache_dir() -> Path:
    """The folder of the cache file (not created here)."""
    explicit = os.environ.get("DARTREE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dartree"


def model_hash(bundle: Bundle) -> str:
    """SHA-256 (hex) over every weight of the bundle's modules: the identity of the model files."""
    digest = hashlib.sha256()
    for prefix, module in [("target", bundle.target), ("drafter", bundle.drafter),
                           *((f"head.{k}", v) for k, v in sorted(bundle.heads.items()))]:
        digest.update(f"{prefix}:{type(module).__name__};".encode())
        if not isinstance(module, torch.nn.Module):
            continue
        for name, tensor in sorted(module.state_dict().items()):
            t = tensor.detach().to("cpu").contiguous()
            digest.update(f"{name}|{t.dtype}|{tuple(t.shape)};".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def _cpu_model() -> str:
    """The CPU's model name on Linux (``/proc/cpuinfo``), else ``""``."""
    with suppress(OSError), open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return ""


def machine(device: torch.device | str) -> dict[str, Any]:
    """What the timing depends on besides the model: device, its name, torch threads."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{_cpu_model() or platform.processor() or platform.machine()}, {os.cpu_count()} cpus"
    return {"device": device.type, "device_name": name, "torch_threads": torch.get_num_threads()}


def _fixed(method: MethodSpec) -> dict[str, Any]:      # the settings tuned as given: a budget / width of auto out
    return {k: v for k, v in sorted(method.config.items()) if not (k in SEARCHED_WHEN_UNSET and v == AUTO)}


def cache_key(bundle: Bundle, method: MethodSpec, temperature: float, digest: str | None = None,
              warps: dict | None = None) -> str:
    """The key of ``method`` tuned for ``bundle`` on this machine at ``temperature`` (a JSON string).  The
    searched fields (``budget`` / ``width`` unset or ``auto``) are left out; ``beta=auto`` stays in it.
    ``digest``: a precomputed :func:`model_hash`."""
    key = {"v": _VERSION, "model": digest or model_hash(bundle), **machine(_device(bundle)), "builder": method.builder,
           "head": method.head, "settings": _fixed(method), "temperature": float(temperature)}
    if method.is_auto and method.verifier:          # auto:verifier=... searched one verifier only
        key["verifier"] = method.verifier
    warp = {k: v for k, v in (warps or {}).items() if v is not None}
    if warp and temperature > 0:                    # tuned under top-k / top-p / min-p: another entry
        key["warps"] = dict(sorted(warp.items()))
    return json.dumps(key, sort_keys=True, default=str)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):          # absent, unreadable or damaged: an empty cache, not an error
        return {}
    return data if isinstance(data, dict) else {}


def lookup(key: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The cached entry of ``key`` (see :func:`entry_of`), or ``None``."""
    entry = _read((folder or cache_dir()) / CACHE_FILE).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict | str):
        return None
    return entry


def store(key: str, entry: dict[str, Any], folder: Path | None = None) -> Path:
    """Add (or replace) ``key`` in the cache file, atomically, under an exclusive ``flock`` on the folder (two
    runs storing at once each keep the other's entry); returns the file's path."""
    import fcntl

    folder = folder or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CACHE_FILE
    lock = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)         # blocking: a store takes milliseconds
        data = _read(path)
        data[key] = entry
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    finally:
        os.close(lock)                           # releases the flock
    return path


def store_or_warn(key: str, entry: dict[str, Any], log, folder: Path | None = None) -> Path | None:
    """:func:`store`, or ``None`` after one line through ``log`` when the cache cannot be written."""
    try:
        return store(key, entry, folder)
    except OSError as e:
        where = e.filename if getattr(e, "filename", None) else (folder or cache_dir())
        log(f"warning: the tuning was not cached for `dartree generate` ({where}: {e.strerror or e}); set "
            "DARTREE_CACHE_DIR to a writable folder to cache it")
        return None


def entry_of(result: Any) -> dict[str, Any]:
    """The cache entry of a :class:`~dartree.eval.tune.TuneResult`: ``settings`` is ``"ar"`` or the fields."""
    return {"settings": "ar" if result.use_ar else result.settings(), "method": result.method,
            "builder": result.best.builder or result.builder, "verifier": result.verifier,
            "forecast_tokens_per_s": result.forecast_tokens_per_s, "ar_tokens_per_s": result.ar_tokens_per_s,
            "calibration_prompts": result.calibration_prompts,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


#: ``generate``'s budget when the method leaves it unset and nothing is cached for this machine: on one CPU
#: thread B=16 beats B=64 for every tree method of the zoo (docs/results.md); on a GPU the paper's B=64 stays.
DEVICE_DEFAULT_BUDGET: dict[str, int] = {"cpu": 16, "cuda": 64}


def tune_hint(method: MethodSpec, temperature: float, threads: int | None = None) -> str:
    """The command that tunes ``method`` here (``threads``: default torch's now) and caches the choice."""
    threads = threads or torch.get_num_threads()
    settings = [f"{k}={v}" for k, v in _fixed(method).items()]
    if method.head not in (None, "gru"):
        settings.append(f"head={method.head}")
    text = method.builder + (":" + ",".join(settings) if settings else "")
    return f"dartree tune --method {text} --temperature {temperature:g} --threads {threads} --num-prompts 8"


def _device(bundle: Bundle) -> torch.device:
    return next(bundle.target.parameters()).device


def _no_tuning(method: MethodSpec, temperature: float, where: str, threads: int | None = None) -> ValueError:
    threads = threads or torch.get_num_threads()
    what = "method auto" if method.is_auto else "budget=auto"
    return ValueError(f"{what}: no tuning of {method.builder} is cached for this model on this machine "
                      f"({where}, {threads} threads, T={temperature:g}); run "
                      f"`{tune_hint(method, temperature, threads)}` once (it caches the choice in {cache_dir()}), "
                      + ("or name a method, e.g. corrected-sequoia:budget=4" if method.is_auto
                         else "or give numbers, e.g. budget=16"))


def check_cached(method: MethodSpec, temperature: float, threads: int | None = None) -> None:
    """Before any model loads: ``ValueError`` when ``method`` asks for ``auto`` and no entry of its builder is
    cached at all (the full check needs the model's hash).  ``threads``: for the message."""
    if not method.auto_fields:
        return
    for key in _read(cache_dir() / CACHE_FILE):
        try:
            if json.loads(key).get("builder") == method.builder:
                return
        except (ValueError, AttributeError):
            continue
    raise _no_tuning(method, temperature, "nothing cached", threads)


def resolve_unset(bundle: Bundle, method: MethodSpec, temperature: float,
                  warps: dict | None = None) -> tuple[MethodSpec, str]:
    """What ``generate`` decodes for ``method``, and a note saying where the settings came from.

    ``auto`` fields (or the method ``auto``): the choice cached for this model and machine, else ``ValueError``
    with the command that tunes it.  Unset ones: the cached choice (with beta unset too, also one that searched
    beta), else :data:`DEVICE_DEFAULT_BUDGET`.  Numbers given stay as they are.
    """
    from dartree.builders import registered
    from dartree.eval.methods import AR

    config, explicit = method.config, bool(method.auto_fields)
    searched = list(method.searched)
    if not method.is_auto and ("budget" not in method.fields() or not searched
                               or (not explicit and "budget" in config)):
        return method, ""                       # the user's numbers (an unset width keeps its default)
    entry = lookup(cache_key(bundle, method, temperature, warps=warps))
    if entry is None and not explicit and "beta" in method.fields() and "beta" not in config:
        # the default `--method dartree-pruned` also takes a tuning that searched beta (make demo's): the
        # tree that pays here, its beta included
        entry = lookup(cache_key(bundle, method.with_settings(beta=AUTO), temperature, warps=warps))
        searched += ["beta"]
    if entry is None:
        device = _device(bundle).type
        if explicit:
            raise _no_tuning(method, temperature, device)
        budget = DEVICE_DEFAULT_BUDGET.get(device, 64)
        return (method.with_settings(budget=budget),
                f"budget={budget}: the measured default on {device}; `{tune_hint(method, temperature)}` tunes this "
                "machine")
    when = f"tuned {entry.get('date_utc', '?')}, cache {cache_dir() / CACHE_FILE}"
    if entry["settings"] == "ar":
        return MethodSpec(AR, label=method.label), (f"auto -> ar for this machine ({when}): no "
                                                    f"{'method' if method.is_auto else 'tree'} beat AR")
    if not method.is_auto:
        chosen = {k: float(v) if k == "beta" else int(v) for k, v in entry["settings"].items() if k in searched}
        rest = {k: v for k, v in method.config.items() if v != AUTO}
        text = " ".join(f"{k}={v}" for k, v in chosen.items())
        return method.with_settings(**chosen, **rest), f"{text} tuned for this machine ({when})"
    builder = entry.get("builder")           # the method auto: the builder, its settings and verifier
    if builder not in registered() or not isinstance(entry["settings"], dict):
        raise ValueError(f"method auto: the cached choice names builder {builder!r}, which is not registered here; "
                         f"run `{tune_hint(method, temperature)}` again")
    chosen = {k: float(v) if k == "beta" else int(v) for k, v in entry["settings"].items()}
    spec = method.member(builder, chosen, entry.get("verifier"))
    text = " ".join([builder, *(f"{k}={v}" for k, v in chosen.items()), *([spec.verifier] if spec.verifier else [])])
    return spec, f"auto -> {text} for this machine ({when})"
