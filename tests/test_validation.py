"""Bad input: every documented error is raised with a message naming the argument."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import dartree
from dartree import BUILDERS, DraftBlock, make_builder, register_builder
from dartree import builders as registry
from dartree.builders import MAX_NODES, BuilderSpec, ChainConfig, builder_spec
from dartree.fast import ops
from dartree.testing import PathHashHead


def block(b: int = 2, gamma: int = 3, vocab: int = 10) -> DraftBlock:
    return DraftBlock(logits=torch.randn(b, gamma, vocab), root=torch.zeros(b, dtype=torch.int64))


@pytest.mark.parametrize("name,config,field", [
    ("ddtree", {"budget": 0}, "budget"),
    ("ddtree", {"budget": 2.5}, "budget"),
    ("ddtree", {"topk": 0}, "topk"),
    ("chain", {"topk": -1}, "topk"),
    ("dartree-pruned", {"width": 0}, "width"),
    ("dartree-pruned", {"beta": 0.1}, "beta"),
    ("dartree-pruned", {"beta": float("nan")}, "beta"),
    ("dartree-pruned", {"beta": float("-inf")}, "beta"),
    ("dartree-pruned", {"beta": -1e39}, "beta"),            # finite in float64, -inf in float32 scores
    ("dartree-pruned", {"beta": -3e38}, "beta"),            # finite in float32, but d * beta is not
    ("sequential-heap", {"normalize": "softmax"}, "normalize"),
    ("chain", {"budget": 4}, "budget"),          # chains take no budget
    ("ddtree", {"width": 4}, "width"),           # only dartree-pruned has a width
    ("dartree-fixed", {"beta": -0.1}, "beta"),   # only dartree-pruned has a depth penalty
])
def test_bad_config_names_the_field(name: str, config: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        make_builder(name, **config)


@pytest.mark.parametrize("name", [["chain"], {"chain": 1}, None, 3])
def test_builder_name_of_the_wrong_type(name) -> None:
    with pytest.raises(ValueError, match=r"^name: expected a builder name \(str\), one of \['chain'"):
        make_builder(name)


def test_bad_name_and_backend() -> None:
    with pytest.raises(ValueError, match=r"^name: unknown builder 'dartree'.*registered"):
        make_builder("dartree")
    with pytest.raises(ValueError, match=r"^backend: must be one of \('ref', 'fast'\)"):
        make_builder("chain", backend="cuda")


def _chain_ref(block, head, config):
    return builder_spec("chain").ref(block, head, config)


GOOD = BuilderSpec(name="user-chain", config_cls=ChainConfig, needs_head=False, ref=_chain_ref)


@pytest.mark.parametrize("spec,field", [
    ("chain", "spec"),
    (None, "spec"),
    ({"name": "x"}, "spec"),
    (dataclasses.replace(GOOD, name="a:b"), "name"),           # a method spec splits at ':'
    (dataclasses.replace(GOOD, name=""), "name"),
    (dataclasses.replace(GOOD, name=" x"), "name"),
    (dataclasses.replace(GOOD, name="a b"), "name"),
    (dataclasses.replace(GOOD, name="a,b"), "name"),
    (dataclasses.replace(GOOD, name="ar"), "name"),            # the method spec of the AR baseline
    (dataclasses.replace(GOOD, name=3), "name"),
    (dataclasses.replace(GOOD, ref=None), "ref"),
    (dataclasses.replace(GOOD, fast="chain"), "fast"),
    (dataclasses.replace(GOOD, config_cls=dict), "config_cls"),
    (dataclasses.replace(GOOD, config_cls=ChainConfig()), "config_cls"),   # an instance, not the class
    (dataclasses.replace(GOOD, needs_head=None), "needs_head"),
    (dataclasses.replace(GOOD, defaults=(("budget", 4),)), "defaults"),     # ChainConfig has no budget
    (dataclasses.replace(GOOD, trusted="yes"), "trusted"),
])
def test_register_builder_refuses_a_bad_spec_and_leaves_the_registry(spec, field: str, monkeypatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = dict(registry._REGISTRY)
    with pytest.raises(ValueError, match=rf"^{field}: (must|expected)"):
        register_builder(spec)
    assert registry._REGISTRY == before


def test_a_valid_spec_registers(monkeypatch) -> None:
    """Names of letters, digits, '-', '_' and '.'; a config without ``topk`` builds (no vocabulary check)."""

    @dataclasses.dataclass(frozen=True)
    class Fixed:
        depth: int = 2

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_builder(dataclasses.replace(GOOD, name="User.chain_2-b", defaults=(("topk", 2),)))
    register_builder(BuilderSpec(name="fixed", config_cls=Fixed, needs_head=False,
                                 ref=lambda block, head, config: make_builder("chain").build(block)))
    assert make_builder("User.chain_2-b").config == ChainConfig(topk=2)
    assert make_builder("fixed").build(block()).num_nodes.tolist() == [4, 4]


def test_a_registered_name_is_not_silently_replaced(monkeypatch, tmp_path, capsys) -> None:
    """A built-in name is refused (a plugin cannot swap ``ddtree`` under the user); another registered name
    needs ``replace=True``; registering the same spec again is a no-op.  From the command line: one line,
    exit 2."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = dict(registry._REGISTRY)
    with pytest.raises(ValueError, match=r"^name: 'ddtree' is one of dartree's own builders"):
        register_builder(dataclasses.replace(GOOD, name="ddtree"))
    assert registry._REGISTRY == before
    mine = dataclasses.replace(GOOD, name="mine")
    register_builder(mine)
    register_builder(mine)
    with pytest.raises(ValueError, match=r"^name: 'mine' is already registered; pass replace=True"):
        register_builder(dataclasses.replace(mine, description="another"))
    register_builder(dataclasses.replace(mine, description="another"), replace=True)
    assert registry._REGISTRY["mine"].description == "another"
    from dartree.cli import main
    (tmp_path / "swap_ddtree.py").write_text(
        "import dataclasses\nfrom dartree.builders import builder_spec, register_builder\n"
        "register_builder(dataclasses.replace(builder_spec('chain'), name='ddtree'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as e:
        main(["show-tree", "--plugin", "swap_ddtree", "--model", "tiny-random"])
    assert e.value.code == 2
    assert "one of dartree's own builders" in capsys.readouterr().err


@pytest.mark.parametrize("name", BUILDERS)
def test_topk_larger_than_vocab(name: str) -> None:
    builder = make_builder(name, topk=11)
    with pytest.raises(ValueError, match=r"^topk: 11 is outside the allowed range 1\.\.V=10"):
        builder.build(block(), PathHashHead() if builder.needs_head else None)


@pytest.mark.parametrize("name", BUILDERS)
def test_head_presence(name: str) -> None:
    builder = make_builder(name, topk=2)
    with pytest.raises(ValueError, match=r"^head:"):
        builder.build(block(), None if builder.needs_head else PathHashHead())


KERNELS = ["host", "torch"]  # the fast backend's CPU path, and the tensorized path (deferred checks)
PATHS = [("ref", "host"), ("fast", "host"), ("fast", "torch")]


def build_on(name: str, backend: str, kernels: str, blk: DraftBlock, head=None, **cfg):
    builder = make_builder(name, backend=backend, **cfg)
    with ops.force_backend(kernels):
        return builder.build(blk, head if builder.needs_head else None)


@pytest.mark.parametrize("backend,kernels", PATHS)
@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_plus_inf_logits(name: str, bad: float, backend: str, kernels: str) -> None:
    blk = block()
    blk.logits[1, 2, 3] = bad
    with pytest.raises(ValueError, match=r"^block\.logits: must not hold NaN or \+inf"):
        build_on(name, backend, kernels, blk, PathHashHead(), topk=2)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", BUILDERS)
def test_minus_inf_masks_tokens(name: str, kernels: str) -> None:
    """-inf logits are accepted: the masked tokens never enter a tree, and both backends agree."""
    blk = block(vocab=12)
    blk.logits[:, :, 5:9] = float("-inf")
    ref = build_on(name, "ref", "host", blk, PathHashHead(), topk=8)
    fast = build_on(name, "fast", kernels, blk, PathHashHead(), topk=8)
    assert fast.canonical() == ref.canonical()
    assert not bool(((ref.tokens >= 5) & (ref.tokens < 9))[:, 1:].any())
    assert bool(torch.isfinite(ref.scores[ref.valid()]).all())


@pytest.mark.parametrize("backend,kernels", PATHS)
@pytest.mark.parametrize("name", BUILDERS)
def test_fewer_finite_logits_than_topk(name: str, backend: str, kernels: str) -> None:
    blk = block(vocab=12)
    blk.logits[1, 2, 2:] = float("-inf")  # row 1, depth 3: two finite logits
    with pytest.raises(ValueError, match=r"^topk: .*fewer than topk=3.*finite logit instead"):
        build_on(name, backend, kernels, blk, PathHashHead(), topk=3)


@pytest.mark.parametrize("name,field", [("ddtree", "budget"), ("dartree-pruned", "budget"),
                                        ("dartree-pruned", "width")])
def test_budget_and_width_upper_bound(name: str, field: str) -> None:
    make_builder(name, **{field: MAX_NODES})
    with pytest.raises(ValueError, match=rf"^{field}: {MAX_NODES + 1} exceeds the limit {MAX_NODES}"):
        make_builder(name, **{field: MAX_NODES + 1})
    with pytest.raises(ValueError, match=rf"^{field}: {10**12} exceeds the limit"):
        make_builder(name, **{field: 10**12})


def test_block_shape_and_dtype_errors() -> None:
    with pytest.raises(ValueError, match=r"^logits:"):
        DraftBlock(logits=torch.randn(3, 10), root=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^logits: expected a floating dtype"):
        DraftBlock(logits=torch.zeros(1, 2, 3, dtype=torch.int64), root=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^root: expected int64 tensor of shape \[2\]"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^root: expected int64"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^hidden: expected shape \[2, 3, H\]"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(2, dtype=torch.int64), hidden=torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"^block: expected a DraftBlock"):
        make_builder("chain").build(torch.randn(2, 3, 10))


class WrongBatchHead(PathHashHead):
    """A head that ignores the block's batch size (e.g. one built for another batch)."""

    def initial_state(self, block):
        return torch.zeros(block.batch_size + 1, 2)


class WrongWidthHead(PathHashHead):
    def logits(self, block, depth, states, candidates):
        return super().logits(block, depth, states, candidates)[..., :-1]


@pytest.mark.parametrize("name", ["corrected-chain", "sequential-heap", "dartree-fixed", "dartree-pruned"])
@pytest.mark.parametrize("head,method", [(WrongBatchHead(), "initial_state"), (WrongWidthHead(), "logits")])
def test_head_output_mismatch(name: str, head, method: str) -> None:
    builder = make_builder(name, topk=3)
    with pytest.raises(ValueError, match=rf"^head\.{method}: returned (logits of )?shape"):
        builder.build(block(), head)


def test_the_reference_core_called_directly_names_a_state_that_is_no_tensor() -> None:
    """Past the facade's checks (dartree.ref.builders called as a function) the reference still says what is wrong."""
    from dartree.ref import builders as ref

    class ListState(PathHashHead):
        def initial_state(self, block):
            return super().initial_state(block).tolist()

    with pytest.raises(ValueError, match=r"^head\.initial_state: returned list, expected a torch\.Tensor"):
        ref.dartree_pruned(block(), ListState(), make_builder("dartree-pruned", topk=3).config)


class BadHead(PathHashHead):
    """NaN or inf corrected logits from ``depth`` on, through both the plain and the fused call."""

    def __init__(self, bad: float, depth: int) -> None:
        super().__init__()
        self.bad, self.depth = bad, depth

    def logits(self, block, depth, states, candidates):
        out = super().logits(block, depth, states, candidates)
        return out * self.bad if depth >= self.depth else out

    def advance_logits(self, block, depth, states, tokens, candidates):
        new, out = super().advance_logits(block, depth, states, tokens, candidates)
        return new, out * self.bad if depth + 1 >= self.depth else out


CORRECTED = ["corrected-chain", "corrected-chain-ddtree", "sequential-heap", "dartree-fixed", "dartree-pruned"]


@pytest.mark.parametrize("backend,kernels", PATHS)
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("name", CORRECTED)
def test_head_non_finite_logits(name: str, bad: float, depth: int, backend: str, kernels: str) -> None:
    with pytest.raises(ValueError, match=r"^head\.logits: must be finite"):
        build_on(name, backend, kernels, block(), BadHead(bad, depth), topk=3,
                 **({} if name.endswith("chain") else {"budget": 12}))


@pytest.mark.parametrize("value", [np.int64(8), np.int32(8), torch.tensor(8)])
def test_integer_fields_take_anything_operator_index_takes(value) -> None:
    config = make_builder("dartree-pruned", budget=value, width=value, topk=value).config
    assert (config.budget, config.width, config.topk) == (8, 8, 8)
    assert all(type(v) is int for v in (config.budget, config.width, config.topk))


@pytest.mark.parametrize("value", [2.0, "3", True, torch.tensor(8.0)])
def test_integer_fields_reject_what_is_not_an_integer(value) -> None:
    with pytest.raises(ValueError, match="budget: must be an integer >= 1"):
        make_builder("ddtree", budget=value)


def test_block_on_the_meta_device_is_one_clear_error() -> None:
    """Meta blocks trace shapes (tests/fast/test_no_sync.py); what reads values says what is wrong."""
    from dartree.tree import check_decodable

    meta = DraftBlock(logits=torch.randn(1, 3, 10, device="meta"), root=torch.zeros(1, dtype=torch.int64,
                                                                                     device="meta"))
    for backend in ("ref", "fast"):                 # the fast backend raised torch's NotImplementedError
        with pytest.raises(ValueError, match=r"^block.logits: on the meta device"):
            make_builder("ddtree", backend, budget=4, topk=3).build(meta)
    tree = make_builder("ddtree", budget=4, topk=3).build(block(b=1))
    with pytest.raises(ValueError, match=r"^block.root: on the meta device"):
        check_decodable(tree.to("meta"), meta)


@pytest.mark.parametrize("root", [10, -1, 10**9])
def test_block_root_outside_the_vocabulary(root: int) -> None:
    with pytest.raises(ValueError, match=r"^root: expected token ids in \[0, 10\)"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.tensor([0, root]))


def test_block_hidden_of_width_zero() -> None:
    with pytest.raises(ValueError, match=r"^hidden: expected shape \[1, 3, H\] \(H >= 1\)"):
        DraftBlock(logits=torch.randn(1, 3, 10), root=torch.tensor([0]), hidden=torch.randn(1, 3, 0))


def test_numpy_and_tensor_numbers_are_taken_as_python_numbers() -> None:
    """``top_k`` / ``top_p`` / ``min_p`` / ``temperature`` / Sequoia's ``acceptance`` as numpy scalars, 0-d
    tensors or a 1-d array decode as the Python numbers they hold (``max_new_tokens`` already did)."""
    from dartree.eval.bundles import tiny_random_bundle
    from dartree.verify.sampling import GeneratorSampler

    bundle = tiny_random_bundle(gamma=4)
    head = bundle.heads[next(iter(bundle.heads))]
    ids = torch.tensor([1, 2, 3])
    out = []
    for acceptance, t, warps in (
            (np.array([0.5, 0.2]), np.float32(0.75), dict(top_k=np.int64(5), top_p=torch.tensor(0.875),
                                                          min_p=np.float64(0.0625))),
            ((0.5, 0.2), 0.75, dict(top_k=5, top_p=0.875, min_p=0.0625))):
        builder = make_builder("corrected-sequoia", budget=4, acceptance=acceptance)
        decoder = dartree.SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=head)
        out.append(decoder.generate(ids, 8, t, GeneratorSampler(torch.Generator().manual_seed(1)),
                                    **warps).tokens.tolist())
    assert out[0] == out[1]
    with pytest.raises(ValueError, match="^top_k"):
        decoder.generate(ids, 8, 0.75, GeneratorSampler(), top_k=np.bool_(True))
