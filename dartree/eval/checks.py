"""Checks of a command's inputs against files and the loaded model, run before anything is decoded: each
raises ``ValueError`` naming the option and the allowed values (one line, not a traceback mid-benchmark)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

from dartree.builders import builder_spec
from dartree.eval.bundles import Bundle
from dartree.eval.methods import MethodSpec

__all__ = ["read_prompt_file", "check_methods_fit", "check_positions"]


def read_prompt_file(path: Path) -> str:
    """The UTF-8 text of ``path``; ``ValueError`` naming the file when it is missing, a folder or not UTF-8."""
    if not path.exists():
        raise ValueError(f"--prompt-file: {path} does not exist")
    if path.is_dir():
        raise ValueError(f"--prompt-file: {path} is a folder; give a text file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompt-file: {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise ValueError(f"--prompt-file: cannot read {path}: {e.strerror or e}") from None


def check_methods_fit(bundle: Bundle, methods: Iterable[MethodSpec], topk_values: Sequence[int] = ()) -> None:
    """Every method's head exists in ``bundle`` and its ``topk`` (and every ``topk_values``) fits the vocabulary."""
    drafter = bundle.drafter        # the drafter's vocabulary (the largest topk a builder can take), else the target's
    vocab = getattr(drafter, "vocab_size", None) or getattr(getattr(drafter, "config", None), "vocab_size", None)
    vocab = int(vocab if vocab is not None else bundle.target.config.get_text_config(decoder=True).vocab_size)
    for m in methods:
        if m.is_ar:
            continue
        if m.head is not None and m.head not in bundle.heads:
            raise ValueError(f"head: model {bundle.name!r} has heads {sorted(bundle.heads)}, got {m.head!r} "
                             f"(in method {m.label!r})")
        if m.is_auto:                   # the builders it searches take their default topk
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(builder_spec(m.builder).config_cls)}
        topk = m.config.get("topk", defaults.get("topk"))
        if topk is not None and int(topk) > vocab:
            raise ValueError(f"topk: {int(topk)} exceeds the vocabulary of model {bundle.name!r} (V={vocab}) in method "
                             f"{m.label!r}; allowed 1..{vocab}")
    for topk in topk_values:
        if topk > vocab:
            raise ValueError(f"values: topk {topk:g} exceeds the vocabulary of model {bundle.name!r} (V={vocab}); "
                             f"allowed 1..{vocab}")


def check_positions(bundle: Bundle, prompt_lengths: Iterable[int], max_new_tokens: int,
                    prompt_option: str = "") -> None:
    """Each prompt plus ``max_new_tokens`` fits the target's maximum positions (``prompt_option``: the option
    that shortens prompts, for the message)."""
    limit = getattr(bundle.target.config.get_text_config(decoder=True), "max_position_embeddings", None)
    if limit is None:                  # the config sets no maximum
        return
    limit = int(limit)
    longest = max(prompt_lengths, default=0)
    if longest + max_new_tokens > limit:
        if longest >= limit:
            raise ValueError(f"prompt: {longest} tokens; model {bundle.name!r} holds at most {limit} positions, "
                             "give a shorter prompt" + (f" (or a smaller {prompt_option})" if prompt_option else ""))
        raise ValueError(f"--max-new-tokens: a prompt of {longest} tokens + {max_new_tokens} new tokens exceeds the "
                         f"{limit} positions model {bundle.name!r} holds; allowed <= {limit - longest}"
                         + (f" (or a smaller {prompt_option})" if prompt_option else ""))
