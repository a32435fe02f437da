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
