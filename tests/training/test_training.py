"""The zoo training pipeline: data split, schedule, stages, checkpoints (the training itself runs offline)."""

from __future__ import annotations

import pytest
import torch

from dartree.training.common import lr_at, resume, save_checkpoint
from dartree.training.data import is_validation, stdlib_files
from dartree.training.pipeline import STAGES, parse_args


def test_corpus_is_the_stdlib_without_tests_or_site_packages():
    files = stdlib_files()
    rels = [rel for rel, _ in files]
    assert len(files) > 300 and rels == sorted(rels)
    assert not any(part in ("site-packages", "test", "tests") for rel in rels for part in rel.split("/"))
    assert "os.py" in rels and "json/__init__.py" in rels


def test_split_is_deterministic_by_path_and_about_five_percent():
    rels = [rel for rel, _ in stdlib_files()]
    val = [r for r in rels if is_validation(r)]
    assert 0.02 < len(val) / len(rels) < 0.09
    assert val == [r for r in rels if is_validation(r)]


def test_schedule_warms_up_then_decays_to_ten_percent():
    assert lr_at(0, 0.0, 1.0, 10) == 0.1
    assert lr_at(50, 0.0, 1.0, 10) == 1.0
    assert abs(lr_at(50, 1.0, 1.0, 10) - 0.1) < 1e-12
    assert lr_at(50, 0.3, 1.0, 10) > lr_at(50, 0.6, 1.0, 10)


def test_defaults():
    args = parse_args([])
    assert args.block_size == 16 and args.threads == 2 and args.vocab == 4096


def test_stages_run_in_pipeline_order_and_unknown_names_are_an_error(capsys):
    assert list(STAGES) == ["data", "target", "distill", "drafter", "heads", "export", "tau"]
    assert parse_args(["--stages", "heads, drafter"]).stages == ["heads", "drafter"]
    for bad in ("drafer", "", "data,,tau,x"):
        with pytest.raises(SystemExit):
            parse_args(["--stages", bad])
        assert "expected comma-separated stages" in capsys.readouterr().err


def test_checkpoint_round_trip_restores_modules_optimizer_and_state(tmp_path):
    def setup(seed):
        torch.manual_seed(seed)
        a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
        return a, b, torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=0.1)

    path = tmp_path / "ckpt.pt"
    a, b, opt = setup(0)
    assert resume(path, "x", {"a": a, "b": b}, opt) == {"step": 0, "elapsed": 0.0, "history": []}
    b(a(torch.ones(1, 3))).sum().backward()
    opt.step()
    save_checkpoint(path, {"a": a, "b": b}, opt, {"step": 1, "elapsed": 2.5, "history": [(1, 0.5)]})
    a2, b2, opt2 = setup(1)
    assert resume(path, "x", {"a": a2, "b": b2}, opt2) == {"step": 1, "elapsed": 2.5, "history": [(1, 0.5)]}
    assert torch.equal(a2.weight, a.weight) and torch.equal(b2.bias, b.bias)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_block_targets_are_the_targets_argmax_or_distribution_at_each_depth():
    import torch.nn.functional as F

    from dartree.training.drafter import block_loss, block_targets

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 20, 7, generator=g)
    anchors = torch.tensor([[3, 9], [0, 15]])
    hard = block_targets(logits, anchors, 4, sampled=False)
    soft = block_targets(logits, anchors, 4, sampled=True)
    assert hard.shape == (2, 2, 4) and soft.shape == (2, 2, 4, 7)
    for s, a, d in ((0, 1, 2), (1, 1, 3), (1, 0, 0)):    # depth d + 1 is labelled at position anchor + d
        p = int(anchors[s, a]) + d
        assert hard[s, a, d] == logits[s, p].argmax()
        torch.testing.assert_close(soft[s, a, d], torch.softmax(logits[s, p], -1))
    draft = torch.randn(2, 2, 4, 7, generator=g)
    torch.testing.assert_close(block_loss(draft, hard),
                               F.cross_entropy(draft.flatten(0, 2), hard.flatten(), reduction="none").view(2, 2, 4))
    one_hot = F.one_hot(hard, 7).float()                 # a distribution on one token is the hard label
    torch.testing.assert_close(block_loss(draft, one_hot), block_loss(draft, hard))


def test_anchors_lie_in_the_continuation_with_room_for_every_depth():
    from dartree.training.drafter import chunk_batch

    chunks = [{"tokens": torch.arange(5 * 60, dtype=torch.int32).view(5, 60), "prompt_len": 20, "sampled": True},
              {"tokens": torch.zeros(4, 30, dtype=torch.int32), "prompt_len": 10, "sampled": False}]
    g = torch.Generator().manual_seed(1)
    x, anchors, sampled = chunk_batch(chunks, 3, 8, 16, g, chunk=0)
    assert x.shape == (3, 60) and x.dtype == torch.int64 and sampled
    # the root is the prompt's last token or later; depth 15's label (position anchor + 14) exists
    assert anchors.shape == (3, 8) and anchors.min() >= 19 and anchors.max() <= 60 - 16
    assert all(len(set(row)) == 8 for row in anchors.tolist())          # distinct anchors per row
    assert len({int(r[0]) // 60 for r in x}) == 3                      # distinct rows of the chunk
    x, anchors, sampled = chunk_batch(chunks, 8, 16, 16, g, chunk=1)   # fewer rows and anchors than asked
    assert x.shape == (4, 30) and anchors.shape == (4, 6) and not sampled
    assert anchors.min() == 9 and anchors.max() == 14


def test_older_distillation_data_is_refused_not_misread(tmp_path):
    from dartree.training.distill import load_distill

    old = {"train": torch.zeros(4, 8, dtype=torch.int32), "validation": torch.zeros(1, 8)}
    torch.save(old, tmp_path / "distill.pt")
    with pytest.raises(ValueError, match="older recipe"):
        load_distill(tmp_path)


def test_init_from_must_be_a_bundle_and_package_prompts_leave_out_the_benchmarks(tmp_path, capsys):
    from dartree.training.distill import EXCLUDED_PACKAGES, package_files

    with pytest.raises(SystemExit):
        parse_args(["--init-from", str(tmp_path)])
    assert "expected a bundle directory with target" in capsys.readouterr().err
    files = package_files(400)
    assert files and not any(part in EXCLUDED_PACKAGES for f in files for part in f.parts)


def test_recipe_options_are_checked_and_a_work_dir_keeps_its_origin(tmp_path, capsys):
    from dartree.training.pipeline import _check_origin

    for argv, what in ((["--distill-new-tokens", "16"], "--distill-new-tokens"), (["--drafter-batch", "33"],
                       "--drafter-batch"), (["--prompt-min", "50", "--prompt-max", "40"], "--prompt-min")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert what in capsys.readouterr().err
    bundle = tmp_path / "bundle"
    for name in ("target", "drafter", "gru_head", "markov_head"):
        (bundle / name).mkdir(parents=True)
    (bundle / "tokenizer.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    _check_origin(parse_args(["--work", str(work)]))                         # from scratch: recorded
    _check_origin(parse_args(["--work", str(work)]))                         # the same origin again: fine
    with pytest.raises(SystemExit, match="init_from"):                       # a kept target would be stale
        _check_origin(parse_args(["--work", str(work), "--init-from", str(bundle)]))


def test_gru_widths_and_head_kinds_are_parsed_and_checked(capsys):
    args = parse_args(["--gru-widths", "64x64, 128x32", "--head-kinds", "gru"])
    assert args.gru_widths == [(64, 64), (128, 32)] and args.head_kinds == ["gru"]
    assert parse_args([]).gru_widths is None and parse_args([]).head_kinds == ["gru", "markov"]
    assert parse_args([]).markov_rank is None                    # the bundle's rank, else 128
    for argv in (["--gru-widths", "64"], ["--gru-widths", "64x0"], ["--gru-widths", "8x8,8x8"],
                 ["--head-kinds", "markov"], ["--head-kinds", "gru,lstm"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert argv[0] in capsys.readouterr().err


def test_heads_trained_side_by_side_are_clipped_apart():
    """A list of parameter lists: each clipped on its own, so a head's update ignores the others' gradients."""
    from dartree.training.common import optimizer_step

    class Bar:
        def update(self, n):
            pass

    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([a, b], lr=1.0)
    state = {"step": 0, "elapsed": 0.0}
    loss = (a * torch.tensor([0.1, 0.0, 0.0])).sum() + (b * torch.tensor([100.0, 0.0, 0.0])).sum()
    optimizer_step(opt, loss, [[a], [b]], 1.0, state, 0.0, Bar())
    assert torch.allclose(a.detach(), torch.tensor([-0.1, 0.0, 0.0]))       # below the clip norm: untouched
    assert torch.allclose(b.detach(), torch.tensor([-1.0, 0.0, 0.0]))       # clipped to norm 1 alone
    assert state["step"] == 1


def test_an_export_is_put_in_place_whole_or_not_at_all(tmp_path):
    """The export stage wrote into --out in place (by default the package's own zoo): interrupted, it left
    new weights beside old ones.  It now writes to a hidden folder and publish() puts that in place."""
    from dartree.training.export import publish

    def bundle(where, text):
        (where / "target").mkdir(parents=True)
        (where / "target" / "config.json").write_text(text)
        (where / "tokenizer.json").write_text(text)
        return where

    out = tmp_path / "zoo" / "m"
    publish(bundle(tmp_path / ".m.export", "one"), out)                     # a new --out: one rename
    assert (out / "target" / "config.json").read_text() == "one" and not (tmp_path / ".m.export").exists()
    (out.parent / ".m.previous").mkdir()                                    # a killed swap's leftover
    publish(bundle(tmp_path / "zoo" / ".m.export", "two"), out)
    assert (out / "tokenizer.json").read_text() == "two"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]            # the earlier bundle removed
    (out / "notes.txt").write_text("mine")
    staged = bundle(tmp_path / "zoo" / ".m.export", "three")
    with pytest.raises(ValueError, match=r"--out: .* holds \['notes.txt'\], which an export does not write"):
        publish(staged, out)
    assert (out / "tokenizer.json").read_text() == "two" and (out / "notes.txt").exists() and staged.exists()
