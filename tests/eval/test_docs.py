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
