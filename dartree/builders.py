"""The TreeBuilder facade: validated configs, the registry name -> (ref, fast), ``make_builder``.

    builder = make_builder("dartree-pruned", backend="ref", budget=64, width=12, topk=64, beta=-0.2)
    tree = builder.build(block, head)

Backend dispatch happens here and nowhere else.  Researchers add a strategy with
:func:`register_builder`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dartree.arguments import check_number
from dartree.block import DraftBlock, check_logits, check_not_meta
from dartree.protocols import CorrectionHead
from dartree.scoring import NORMALIZE_CHOICES, Normalize
from dartree.sequoia import DEFAULT_ACCEPTANCE, check_acceptance
from dartree.timing import TimedHead, checked_head
from dartree.tree import DraftTree, check_decodable

__all__ = ["ChainConfig", "TreeConfig", "PrunedConfig", "SequoiaConfig", "BuilderSpec", "TreeBuilder", "BUILDERS",
           "BACKENDS", "make_builder", "register_builder", "builder_spec", "checked_tree", "registered", "shape_of"]

BACKENDS: tuple[str, ...] = ("ref", "fast")
MAX_NODES = 1 << 14
"""Upper bound of ``budget`` and ``width``: a tree of n nodes needs an [n, n] attention mask in the
target (and a supertree of W nodes per depth W head branches), so 16384 is already far beyond what a
target verifies in one forward; a larger value is a typo, not a tree.  The candidate trie bounds the
tree too: a tree never holds more than its ``K + K^2 + ... + K^gamma`` nodes."""
#: The most negative depth penalty: scores are float32 and a node at depth d carries ``d * beta``
#: (d <= budget <= MAX_NODES), so past this a deep node's score rounds to -inf, the padding value.
MIN_BETA = -1e30


def _check_int(owner: Any, name: str, low: int, high: int | None = None) -> None:
    """Check the integer field ``name`` of the frozen config ``owner``; anything ``operator.index`` accepts
    (numpy or 0-d tensor integers) is stored as a plain ``int``."""
    value = getattr(owner, name)
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}") from None
    if value < low:
        raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name}: {value} exceeds the limit {high} (dartree.builders.MAX_NODES: a tree of n "
                         f"nodes needs an n x n attention mask in the target)")
    object.__setattr__(owner, name, value)


def _check_normalize(value: Any) -> None:
    if value not in NORMALIZE_CHOICES:
        raise ValueError(f"normalize: must be one of {NORMALIZE_CHOICES}, got {value!r}")


@dataclass(frozen=True)
class ChainConfig:
    """Chains (``chain``, ``corrected-chain``): one node per depth, gamma draft nodes.

    topk: candidates per depth (``1 <= topk <= V``); the chain picks the best.  normalize: ``"vocab"`` or
    ``"candidates"`` (what log q is normalised over; :mod:`dartree.scoring`).
    """

    topk: int = 1
    normalize: Normalize = "vocab"

    def __post_init__(self) -> None:
        _check_int(self, "topk", 1)
        _check_normalize(self.normalize)


@dataclass(frozen=True)
class TreeConfig:
    """Budgeted trees (``ddtree``, ``corrected-chain-ddtree``, ``sequential-heap``, ``dartree-fixed``).

    budget: draft nodes (root excluded), ``>= 1``; a tree is smaller only if the candidate trie is.
    topk: candidates per depth, ``1 <= topk <= V``.  normalize: ``"vocab"`` or ``"candidates"``.
    """

    budget: int = 64
    topk: int = 64
    normalize: Normalize = "vocab"

    def __post_init__(self) -> None:
        _check_int(self, "budget", 1, MAX_NODES)
        _check_int(self, "topk", 1)
        _check_normalize(self.normalize)


@dataclass(frozen=True)
class PrunedConfig:
    """``dartree-pruned``: a supertree of ``width`` nodes per depth, then the global top-``budget``.

    beta: depth penalty added to every node's score, ``<= 0`` (prefix closure needs it; Lemma 1).
    bound: exact bound pruning in the fast backend (docs/builders.md, "Bound pruning"): stop expanding once no
        branch can enter the top-``budget``; the tree is the same node for node (the reference ignores it).
    """

    budget: int = 64
    width: int = 12
    topk: int = 64
    beta: float = -0.2
    normalize: Normalize = "candidates"
    bound: bool = True

    def __post_init__(self) -> None:
        _check_int(self, "budget", 1, MAX_NODES)
        _check_int(self, "width", 1, MAX_NODES)
        _check_int(self, "topk", 1)
        _check_normalize(self.normalize)
        check_number("beta", self.beta, lambda x: x <= 0,
                     "must be a finite number <= 0 (a depth penalty: a positive value breaks prefix closure)")
        if not self.beta >= MIN_BETA:        # NaN, -inf, and penalties that overflow float32 scores
            raise ValueError(f"beta: must be a finite number in [{MIN_BETA:g}, 0] (a depth penalty; scores are "
                             f"float32 and d * beta must stay finite), got {self.beta!r}")
        if not isinstance(self.bound, bool):
            raise ValueError(f"bound: must be True or False, got {self.bound!r}")


@dataclass(frozen=True)
class SequoiaConfig:
    """``sequoia`` / ``corrected-sequoia``: the rank-optimal shape of :mod:`dartree.sequoia`.

    budget, topk, normalize: as :class:`TreeConfig` (fewer nodes only where ``gamma`` and ``len(acceptance)`` cap
    the shape; a node's ``r``-th child is its ``r``-th best candidate, the head's for ``corrected-sequoia``).
    acceptance: ``P_r`` (:func:`dartree.sequoia.check_acceptance`; ``"0.5/0.2/0.1"`` is read too).
    head_depths (``None``: every depth), reuse_depths (``0``: draft every round), proposal_temperature (a multiple
    of the run's, ``> 0``): the rejection verifier's settings, their defaults and why: docs/builders.md,
    "Sequoia's rank-optimal shape".
    """

    budget: int = 16
    acceptance: tuple[float, ...] = DEFAULT_ACCEPTANCE
    topk: int = 64
    normalize: Normalize = "candidates"
    head_depths: int | None = 3
    reuse_depths: int = 2
    proposal_temperature: float = 1.0

    def __post_init__(self) -> None:
        _check_int(self, "budget", 1, MAX_NODES)
        object.__setattr__(self, "acceptance", check_acceptance(self.acceptance))
        _check_int(self, "topk", 1)
        _check_normalize(self.normalize)
        if self.head_depths is not None:
            _check_int(self, "head_depths", 1)
        _check_int(self, "reuse_depths", 0)
        ratio = self.proposal_temperature
        check_number("proposal_temperature", ratio, lambda x: 0 < x < math.inf,
                     "must be a finite number > 0 (the proposal's temperature over the run's; 1: the run's own)")
        object.__setattr__(self, "proposal_temperature", float(ratio))


BuildFn = Callable[[DraftBlock, "CorrectionHead | None", Any], DraftTree]


@dataclass(frozen=True)
class BuilderSpec:
    """A registry entry: how to configure a strategy and the functions of each backend; the fields, what
    :func:`register_builder` checks of them and when ``trusted`` is honoured: docs/builders.md, "Adding a
    strategy".  ``trusted`` skips :func:`dartree.tree.check_decodable` (perf: one host sync per round on
    accelerators)."""

    name: str
    config_cls: type
    needs_head: bool
    ref: BuildFn
    fast: BuildFn | None = None
    defaults: tuple[tuple[str, Any], ...] = ()
    description: str = ""
    trusted: bool = False


_REGISTRY: dict[str, BuilderSpec] = {}
#: ``(build function, config class)`` of each backend of every strategy built into dartree: the only
#: ones whose ``BuilderSpec.trusted`` is honoured (filled by ``_register_defaults``).
_BUILT_IN: set[tuple[BuildFn, type]] = set()
#: A builder name: it starts a method spec (``NAME[:KEY=VALUE,...]``) and is one command-line word.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Names a method spec gives another meaning (``dartree.eval.methods.AR``: the autoregressive baseline).
_RESERVED_NAMES = ("ar",)


def register_builder(spec: BuilderSpec, *, replace: bool = False) -> None:
    """Add a strategy to the registry; ``ValueError`` naming the bad field (the registry untouched) if ``spec``
    is not a valid :class:`BuilderSpec`, or if its name is dartree's own (:data:`BUILDERS`: a plugin never
    silently replaces a built-in strategy) or already registered and ``replace`` is False."""
    if not isinstance(spec, BuilderSpec):
        raise ValueError(f"spec: expected a BuilderSpec, got {type(spec).__name__}")
    name = spec.name
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in _RESERVED_NAMES:
        raise ValueError(f"name: must be a non-empty str of letters, digits, '-', '_' and '.', starting with a "
                         f"letter or digit, and not one of {_RESERVED_NAMES} (a method is NAME[:KEY=VALUE,...]); "
                         f"got {name!r}")
    if not isinstance(spec.config_cls, type) or not dataclasses.is_dataclass(spec.config_cls):
        raise ValueError(f"config_cls: must be a dataclass type whose fields are the settings (e.g. TreeConfig), "
                         f"got {spec.config_cls!r}")
    if not isinstance(spec.needs_head, bool):
        raise ValueError(f"needs_head: must be True or False, got {spec.needs_head!r}")
    if not callable(spec.ref):
        raise ValueError(f"ref: must be a callable fn(block, head, config) -> DraftTree, got {spec.ref!r}")
    if spec.fast is not None and not callable(spec.fast):
        raise ValueError(f"fast: must be None or a callable fn(block, head, config) -> DraftTree, got {spec.fast!r}")
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    if not isinstance(spec.defaults, tuple) or not all(
            isinstance(d, tuple) and len(d) == 2 and d[0] in fields for d in spec.defaults):
        raise ValueError(f"defaults: must be a tuple of (field, value) pairs, fields of {spec.config_cls.__name__} "
                         f"{sorted(fields)}; got {spec.defaults!r}")
    if not isinstance(spec.trusted, bool):
        raise ValueError(f"trusted: must be True or False, got {spec.trusted!r}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        if spec.name in _BUILT_IN_NAMES:
            raise ValueError(f"name: {spec.name!r} is one of dartree's own builders {sorted(_BUILT_IN_NAMES)}; "
                             f"register yours under another name")
        if not replace:
            raise ValueError(f"name: {spec.name!r} is already registered; pass replace=True to replace it, or "
                             f"choose another name")
    _REGISTRY[spec.name] = spec


def builder_spec(name: str) -> BuilderSpec:
    if not isinstance(name, str):
        raise ValueError(f"name: expected a builder name (str), one of {sorted(_REGISTRY)}; got {type(name).__name__}")
    if name not in _REGISTRY:
        raise ValueError(f"name: unknown builder {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


class TreeBuilder:
    """A configured tree-construction strategy on one backend.  Call :meth:`build` once per round."""

    def __init__(self, spec: BuilderSpec, backend: str, config: Any) -> None:
        self.spec = spec
        self.backend = backend
        self.config = config
        if backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
        fn = spec.ref if backend == "ref" else spec.fast
        if fn is None:
            raise ValueError(f"backend: {backend!r} is not available for builder {spec.name!r}")
        self._fn = fn

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs_head(self) -> bool:
        return self.spec.needs_head

    @property
    def trusted(self) -> bool:
        """Whether its trees meet the decoder's contract by construction: :attr:`BuilderSpec.trusted`, honoured
        for dartree's own functions called by :meth:`TreeBuilder.build` itself (a subclass overriding ``build`` is
        checked), read at every call (a spec or function replaced later is not trusted either)."""
        spec = self.spec
        return (type(self).build is TreeBuilder.build and isinstance(spec, BuilderSpec) and spec.trusted is True
                and (self._fn, spec.config_cls) in _BUILT_IN)

    def __repr__(self) -> str:
        return f"TreeBuilder({self.name!r}, backend={self.backend!r}, {self.config})"

    def build(self, block: DraftBlock, head: CorrectionHead | None = None) -> DraftTree:
        """Build one draft tree per row of ``block``.

        ``-inf`` logits mask tokens (fewer than ``topk`` finite logits at a position is an error); NaN or ``+inf``
        logits, and NaN / inf corrected logits, are errors on both backends.  The head's outputs are checked as the
        decoder checks them (:func:`dartree.timing.checked_head`), and the tree of a strategy that is not
        dartree's own as the decoder needs it (:func:`dartree.tree.check_decodable`, the config's ``budget`` included).

        Shape:
            block.logits ``[b, gamma, V]`` -> DraftTree with ``b`` rows.
        """
        if not isinstance(block, DraftBlock):
            raise ValueError(f"block: expected a DraftBlock, got {type(block).__name__}")
        if self.needs_head and head is None:
            raise ValueError(f"head: builder {self.name!r} needs a CorrectionHead, got None")
        if not self.needs_head and head is not None:
            raise ValueError(f"head: builder {self.name!r} uses no correction head; pass head=None")
        topk = getattr(self.config, "topk", None)        # a registered strategy's config may have none
        if topk is not None and topk > block.vocab_size:
            raise ValueError(f"topk: {topk} is outside the allowed range 1..V={block.vocab_size} (block vocabulary)")
        if head is not None and not isinstance(head, TimedHead):  # the decoders' head is one: checked already
            head = checked_head(head, block.device)  # every output checked where it enters, as in the decoder
        if self.backend == "ref":
            check_not_meta("block.logits", block.logits)
            check_logits("block.logits", block.logits)  # NaN / +inf; the fast builders check as they read
            return self._checked(self._fn(block, head, self.config), block)
        from dartree.fast import checks

        # the fast builders read the block (and the head's outputs) on the host, where a tensor that
        # requires grad cannot go: a drafter or head run with autograd on gives the trees it gives without
        # (its tree is integers; the ref backend's torch ops take such tensors as they are)
        if block.logits.requires_grad or (block.hidden is not None and block.hidden.requires_grad):
            block = dataclasses.replace(block, logits=block.logits.detach(),
                                        hidden=None if block.hidden is None else block.hidden.detach())
        from dartree.fast import ops

        if ops.forced_backend() is None:    # a forced backend may trace shapes on meta (tests/fast/test_no_sync.py)
            check_not_meta("block.logits", block.logits)
        with checks.collect(), torch.no_grad():  # off the CPU: the deferred checks, read in one sync at the end
            tree = self._fn(block, head, self.config)
        return self._checked(tree, block)

    def _checked(self, tree: DraftTree, block: DraftBlock) -> DraftTree:
        """A registered strategy's tree, checked as the decoder needs it (:func:`dartree.tree.check_decodable`,
        the config's ``budget`` included) unless the strategy is trusted (dartree's own: :attr:`trusted`)."""
        return tree if self.trusted else _decodable(tree, block, self.config)


def checked_tree(builder: object, tree: DraftTree, block: DraftBlock) -> DraftTree:
    """``tree``, checked by :func:`dartree.tree.check_decodable` (against the config's ``budget``) unless
    ``builder`` is a :class:`TreeBuilder` whose ``build`` is :meth:`TreeBuilder.build` (which checked it already,
    or trusts dartree's own strategies).  The decoders call this on every tree a builder hands them."""
    if isinstance(builder, TreeBuilder) and type(builder).build is TreeBuilder.build:
        return tree                # TreeBuilder.build checked it already (or it is dartree's own, trusted)
    return _decodable(tree, block, getattr(builder, "config", None))


def _decodable(tree: DraftTree, block: DraftBlock, config: Any) -> DraftTree:
    """:func:`dartree.tree.check_decodable` against ``config``'s ``budget`` when it has an integer one."""
    budget = getattr(config, "budget", None)
    return check_decodable(tree, block, budget if isinstance(budget, int) and not isinstance(budget, bool) else None)


def shape_of(builder: object) -> Callable[[DraftBlock, int, torch.Tensor], DraftTree] | None:
    """For a verifier that redraws every draft token: ``shape(block, gamma, roots)``, the tree shape of a
    trusted Sequoia builder (static: no candidate selection, no head call; tokens ``PAD`` but the root), or
    ``None`` for every other builder (its whole tree is built, and only its shape is used)."""
    config = getattr(builder, "config", None)
    if not (isinstance(config, SequoiaConfig) and getattr(builder, "trusted", False)):
        return None
    from dartree.fast.sequoia import shape_tree

    return lambda block, gamma, roots: shape_tree(block, config, gamma, roots)


def make_builder(name: str, backend: str = "ref", **config: Any) -> TreeBuilder:
    """A :class:`TreeBuilder` for registry entry ``name`` on ``backend`` (``"ref"`` or ``"fast"``); ``config``
    holds fields of the entry's config dataclass (unknown fields are an error)."""
    spec = builder_spec(name)
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    if backend == "fast" and spec.fast is None:
        raise ValueError(f"backend: 'fast' is not available for builder {name!r}; use backend='ref'")
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(f"{unknown[0]}: not a field of builder {name!r}; allowed fields: {sorted(fields)}")
    return TreeBuilder(spec, backend, spec.config_cls(**{**dict(spec.defaults), **config}))


def _register_defaults() -> None:
    from dartree.fast import builders as fast
    from dartree.ref import builders as ref

    corrected = (("topk", 64), ("normalize", "candidates"))
    table = [
        ("chain", ChainConfig, False, "chain", (), "argmax of the base logits at every depth (DFlash)"),
        ("ddtree", TreeConfig, False, "ddtree", (), "best-first heap over base marginals, top-B prefixes (DDTree)"),
        ("corrected-chain", ChainConfig, True, "corrected_chain", corrected,
         "greedy chain re-scored by the head along its own path (Domino)"),
        ("corrected-chain-ddtree", TreeConfig, True, "corrected_chain_ddtree", corrected[1:],
         "head along the corrected chain; DDTree heap over those per-depth distributions"),
        ("sequential-heap", TreeConfig, True, "sequential_heap", corrected[1:],
         "exact best-first under corrected scores, one head call per popped node"),
        ("dartree-fixed", TreeConfig, True, "dartree_fixed", corrected[1:],
         "depth-wise batched expansion, quota per depth from the budget, no pruning (DARTree fixed)"),
        ("dartree-pruned", PrunedConfig, True, "dartree_pruned", (),
         "depth-wise supertree of width W, then one global top-B by s_beta (DARTree pruned)"),
        ("sequoia", SequoiaConfig, False, "sequoia", (),
         "rank-optimal static shape for sampled trees; r-th child = r-th base candidate (Sequoia)"),
        ("corrected-sequoia", SequoiaConfig, True, "corrected_sequoia", (),
         "Sequoia's shape, r-th child = r-th candidate under the head along the path"),
    ]
    for name, cls, needs_head, attr, defaults, text in table:
        spec = BuilderSpec(name=name, config_cls=cls, needs_head=needs_head, ref=getattr(ref, attr),
                           fast=getattr(fast, attr), defaults=defaults, description=text, trusted=True)
        register_builder(spec)
        _BUILT_IN.update((fn, cls) for fn in (spec.ref, spec.fast) if fn is not None)


_BUILT_IN_NAMES: frozenset[str] = frozenset()
_register_defaults()
#: the strategies built into dartree (:func:`registered` adds those registered since)
BUILDERS: tuple[str, ...] = tuple(_REGISTRY)
_BUILT_IN_NAMES = frozenset(BUILDERS)


def registered() -> tuple[str, ...]:
    """Every strategy name in the registry now: dartree's own (:data:`BUILDERS`) and any registered since."""
    return tuple(_REGISTRY)
