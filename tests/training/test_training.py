"""The zoo training script's data split and schedule (the training itself runs offline)."""

from __future__ import annotations

from dartree.training.common import lr_at
from dartree.training.data import is_validation, stdlib_files
from dartree.training.pipeline import parse_args


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
