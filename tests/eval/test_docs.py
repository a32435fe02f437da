"""The code of docs/custom-head.md runs as written (every python block, in order, one namespace)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom-head.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_custom_head_doc_runs(capsys):
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) == 4
    head_class = blocks[0].strip().splitlines()
    assert len([line for line in head_class if line.strip()]) <= 32      # "a custom head in about 30 lines"
    namespace: dict = {"__name__": "custom_head_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "(root)" in out and "tau" in out and "head=bigram" in out


def test_extending_doc_runs(capsys):
    """docs/extending.md: the beam builder, its contract check and a lossless decode, as written."""
    from dartree import builders

    saved = dict(builders._REGISTRY)
    doc = DOC.parent / "extending.md"
    namespace: dict = {"__name__": "extending_doc"}
    try:
        for block in python_blocks(doc.read_text()):
            exec(compile(block, str(doc), "exec"), namespace)
    finally:
        builders._REGISTRY.clear()
        builders._REGISTRY.update(saved)
    out = capsys.readouterr().out
    assert "True" in out and "tau" in out
