"""Methods as the harness names them, parsed from ``NAME[:KEY=VALUE,...]`` text, e.g.
``dartree-pruned:budget=32,width=8,head=markov`` (the syntax: docs/internals.md, "The benchmark harness")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dartree.builders import TreeBuilder, builder_spec, make_builder, registered
from dartree.decode import SpeculativeDecoder
from dartree.eval.bundles import Bundle
from dartree.rounds import DEFAULT_VERIFIER, SAMPLED_VERIFIERS, VERIFIERS

__all__ = ["AR", "AUTO", "AUTO_FIELDS", "SEARCHED_WHEN_UNSET", "DRAFTERS", "register_drafter",
           "MethodSpec", "parse_method", "parse_methods", "BACKEND_CHOICES", "resolve_backend",
           "make_method_builder", "make_decoder", "sampler_for"]

AR = "ar"
AUTO = "auto"
AUTO_FIELDS = ("budget", "width", "beta")
#: the auto fields a tuner also searches when they are left unset (beta: only when asked, ``beta=auto``)
SEARCHED_WHEN_UNSET = ("budget", "width")
BACKEND_CHOICES = ("auto", "ref", "fast")


@dataclass(frozen=True)
class MethodSpec:
    """A method to benchmark."""

    builder: str                                 # "ar", "auto" or a registry name
    settings: tuple[tuple[str, Any], ...] = ()   # the config fields set explicitly, sorted (values may be "auto")
    head: str | None = None                      # the bundle head a corrected builder uses
    label: str = ""                              # how tables name it (the text it was parsed from, normalised)
    verifier: str | None = None       # the T>0 acceptance rule (VERIFIERS; None: the run's default)
    drafter: str | None = None        # a registered drafter (DRAFTERS; None: the bundle's own)

    @property
    def is_ar(self) -> bool:
        return self.builder == AR

    @property
    def is_auto(self) -> bool:
        """The method ``auto``: the builder, its budget and (at T>0) the verifier are chosen by the tuner."""
        return self.builder == AUTO

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.settings)

    @property
    def auto_fields(self) -> tuple[str, ...]:
        """The settings the tuner chooses (``("builder",)`` for the method ``auto``: everything)."""
        if self.is_auto:
            return ("builder",)
        return tuple(k for k, v in self.settings if v == AUTO)

    @property
    def searched(self) -> tuple[str, ...]:
        """The settings a tuner searches: budget and width where the builder has them and they are unset or
        ``auto``, beta only when ``auto``."""
        config, fields = self.config, self.fields()
        return tuple(k for k in AUTO_FIELDS if k in fields
                     and (config.get(k) == AUTO or (k in SEARCHED_WHEN_UNSET and k not in config)))

    def under(self, verifier: str | None) -> MethodSpec:
        """This method with the run's ``verifier`` where it names none (its own wins)."""
        return self if self.verifier or verifier is None else dataclasses.replace(self, verifier=verifier)

    def verifier_at(self, temperature: float, default: str | None = None) -> str:
        """How it verifies at ``temperature``: ``greedy`` at 0; at T>0 its own verifier, else the run's
        ``default``, else ``DEFAULT_VERIFIER``; ``match`` for AR (its tokens are compared, never law-tested: what
        it draws with is the caller's, the generator sampler unless the run matches)."""
        if temperature == 0:
            return "greedy"
        return "match" if self.is_ar else self.verifier or default or DEFAULT_VERIFIER

    def member(self, builder: str, settings: dict[str, Any], verifier: str | None = None) -> MethodSpec:
        """The method ``auto`` as ``builder`` with ``settings``: its head (default gru) where the builder takes
        one, its label and drafter, and ``verifier``, else its own."""
        head = (self.head or "gru") if builder_spec(builder).needs_head else None
        return MethodSpec(builder, tuple(sorted(settings.items())), head, self.label, verifier or self.verifier,
                          self.drafter)

    def with_settings(self, **values: Any) -> MethodSpec:
        """A copy with ``values`` replacing (or adding) settings; the label is kept."""
        merged = {**self.config, **values}
        return dataclasses.replace(self, settings=tuple(sorted(merged.items())))

    def fields(self) -> tuple[str, ...]:
        """Config fields of the builder (empty for ``ar`` and ``auto``)."""
        if self.is_ar or self.is_auto:
            return ()
        return tuple(f.name for f in dataclasses.fields(builder_spec(self.builder).config_cls))


def _value(key: str, text: str, kind: Any) -> Any:
    """``text`` as the config field's annotated type (int, float, bool or str; a plugin's own fields too);
    ``none`` for a field that may be ``None`` (e.g. ``head_depths=none``: the head proposes at every depth),
    ``auto`` for the fields a tuner searches (:data:`AUTO_FIELDS`)."""
    if text == AUTO:
        if key not in AUTO_FIELDS:
            raise ValueError(f"{key}: 'auto' is allowed only for {AUTO_FIELDS}")
        return AUTO
    name = (kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))).replace(" ", "")
    if name.endswith("|None") and text.lower() == "none":
        return None
    try:
        if name in ("int", "int|None"):
            return int(text)
        if name in ("float", "float|None", "int|float"):
            return float(text)
        if name in ("bool", "bool|None"):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
    except ValueError:
        also = " or 'auto'" if key in AUTO_FIELDS else ""
        raise ValueError(f"{key}: expected {name.split('|')[0]}{also}, got {text!r}") from None
    return text


def _option(key: str, raw: str) -> str:
    """A method's ``verifier=`` or ``drafter=``, checked."""
    allowed = VERIFIERS if key == "verifier" else tuple(DRAFTERS)
    if raw not in allowed:
        more = " (dartree.eval.methods.register_drafter adds more)" if key == "drafter" else ""
        raise ValueError(f"{key}: expected one of {allowed}{more}, got {raw!r}")
    return raw


def parse_method(text: str, defaults: dict[str, Any] | None = None) -> MethodSpec:
    """Parse ``NAME[:KEY=VALUE,...]``; ``defaults`` fill the fields the builder has and the text leaves unset.

    Raises ``ValueError`` naming the bad part and the allowed values.  The builder config itself is
    validated here too (by building it), so a bad value fails before any model runs.
    """
    name, _, rest = text.partition(":")
    name = name.strip()
    allowed = (AR, AUTO, *registered())       # read now: a strategy registered after import is a method too
    if name not in allowed:
        raise ValueError(f"method: unknown method {name!r}; allowed: {allowed}")
    if name == AR:
        if rest.strip():
            raise ValueError(f"method: 'ar' takes no settings, got {text!r}")
        return MethodSpec(AR, label=AR)
    # auto: the tuner picks the builder and its settings; ``head`` is the one a corrected builder would use
    spec = None if name == AUTO else builder_spec(name)
    kinds = {} if spec is None else {f.name: f.type for f in dataclasses.fields(spec.config_cls)}
    fields = tuple(kinds)
    settings: dict[str, Any] = {}
    head: str | None = "gru" if spec is not None and spec.needs_head else None
    options: dict[str, str] = {}
    items: list[str] = []                          # KEY=VALUE as given, spaces stripped: the label
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if spec is None and (not eq or key not in ("verifier", "head", "drafter")):
            raise ValueError(f"method: 'auto' takes only verifier=, head= and drafter= (the tuner picks the builder "
                             f"and its settings), got {item!r} in {text!r}")
        if not eq or not key:
            raise ValueError(f"method: expected KEY=VALUE in {text!r}, got {item!r}")
        if any(i.partition("=")[0] == key for i in items):
            raise ValueError(f"{key}: set twice in {text!r}; give each setting once")
        items.append(f"{key}={raw.strip()}")
        if key == "head":
            if spec is not None and not spec.needs_head:
                raise ValueError(f"head: builder {name!r} uses no correction head")
            head = raw.strip()
            continue
        if key in ("verifier", "drafter"):
            options[key] = _option(key, raw.strip())
            continue
        if key not in fields:
            allowed_keys = ((*fields, "head") if spec.needs_head else fields) + ("verifier", "drafter")
            raise ValueError(f"{key}: not a setting of {name!r}; allowed: {allowed_keys}")
        settings[key] = _value(key, raw.strip(), kinds[key])
    label = name + (":" + ",".join(items) if items else "")
    for key, value in (defaults or {}).items():
        if key in fields and key not in settings and value is not None:
            settings[key] = value
    method = MethodSpec(name, tuple(sorted(settings.items())), head, label, options.get("verifier"),
                        options.get("drafter"))
    if spec is not None:                           # validates every concrete value now
        make_builder(name, "ref", **{k: v for k, v in settings.items() if v != AUTO})
    return method


def parse_methods(texts: list[str] | tuple[str, ...], defaults: dict[str, Any] | None = None) -> tuple[MethodSpec, ...]:
    """Parse several methods; duplicate labels are an error (tables are keyed by label)."""
    methods = tuple(parse_method(t, defaults) for t in texts)
    labels = [m.label for m in methods]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"methods: each method must appear once, repeated: {dup}")
    if not methods:
        raise ValueError("methods: need at least one method")
    return methods


def resolve_backend(builder: str, backend: str) -> str:
    """``auto`` -> ``fast`` when the builder has a fast backend registered, else ``ref``."""
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"backend: must be one of {BACKEND_CHOICES}, got {backend!r}")
    if backend != "auto":
        return backend
    return "fast" if builder_spec(builder).fast is not None else "ref"


def make_method_builder(method: MethodSpec, backend: str) -> TreeBuilder:
    """The configured builder of ``method`` (every ``auto`` must have been resolved)."""
    if method.is_ar:
        raise ValueError("method: 'ar' has no tree builder")
    if method.auto_fields:
        raise ValueError(f"method: {method.label!r} still has {method.auto_fields} = 'auto'; tune it first")
    return make_builder(method.builder, resolve_backend(method.builder, backend), **method.config)


def _lookup_drafter(bundle: Bundle):
    from dartree.lookup import PromptLookupDrafter

    return PromptLookupDrafter(int(bundle.target.config.get_text_config(decoder=True).vocab_size), gamma=4)


#: drafters a method names with ``drafter=NAME``: name -> ``factory(bundle) -> drafter`` (a plugin adds its own
#: with :func:`register_drafter`); a method that names none drafts with the bundle's drafter
DRAFTERS: dict[str, Any] = {"lookup": _lookup_drafter}


def register_drafter(name: str, factory: Any) -> None:
    """Make ``drafter=NAME`` in a method mean ``factory(bundle)`` (a drafter on the protocol of
    :mod:`dartree.decode`); ``ValueError`` naming the argument for a bad name or a factory that is not callable."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier (it is written drafter=NAME in a method), got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory: expected a callable factory(bundle) -> drafter, got {type(factory).__name__}")
    DRAFTERS[name] = factory


def make_decoder(bundle: Bundle, method: MethodSpec, backend: str, builder: Any = None) -> SpeculativeDecoder:
    """A :class:`SpeculativeDecoder` for ``method`` on ``bundle`` (``builder`` overrides the built one; the
    method's ``drafter=`` replaces the bundle's drafter)."""
    builder = builder if builder is not None else make_method_builder(method, backend)
    if method.head is not None and method.head not in bundle.heads:
        raise ValueError(f"head: bundle {bundle.name!r} has heads {sorted(bundle.heads)}, got {method.head!r}")
    head = None if method.head is None else bundle.heads[method.head]
    drafter = bundle.drafter if method.drafter is None else DRAFTERS[method.drafter](bundle)
    return SpeculativeDecoder(bundle.target, drafter, builder, head)


def sampler_for(verifier: str | None, seed: int, stream: int | None = None, device="cpu"):
    """The sampler a T>0 decode verified by ``verifier`` draws with: keyed draws for ``match`` (and ``None``),
    equal token for token to a keyed AR's with the same seed; for sampled trees (and AR's own, cheaper draws:
    pass ``DEFAULT_VERIFIER``) a generator seeded with ``seed``, or per ``stream`` when given."""
    import torch

    from dartree.verify.sampling import GeneratorSampler, KeyedSampler

    if verifier in SAMPLED_VERIFIERS:
        return GeneratorSampler(torch.Generator(device=device).manual_seed(
            seed if stream is None else (seed * 1_000_003 + stream) % 2**64))
    return KeyedSampler(seed)
