"""Helpers shared by the command-line tests."""

from __future__ import annotations

import pytest

from dartree.cli import main


def fails(argv, capsys) -> str:
    """Run ``main(argv)``: it must exit 2 with one ``dartree: error:`` line, the last on stderr (progress
    lines such as "model ... loaded" may come before it) and no traceback; returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dartree: error: ") and not any("error" in line for line in err[:-1]), err
    return err[-1]
