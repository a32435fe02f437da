"""A third-party builder in a module of its own, reached from the command line with --plugin: typed custom
settings, the settings column, lossless decoding; a module that does not import is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    """A beam builder with a custom setting, registered on import."""
    import dataclasses

    import torch

    from dartree.builders import BuilderSpec, TreeConfig, register_builder
    from dartree.ref.core import Node, assemble
    from dartree.scoring import candidates


    @dataclasses.dataclass(frozen=True)
    class BeamConfig(TreeConfig):
        max_children: int = 3


    def beam(block, head, config):
        assert isinstance(config.max_children, int)          # typed from the annotation, not the string '2'
        cands = candidates(block, config.topk, config.normalize)
        roots, rows = [], []
        for r in range(block.batch_size):
            root = Node(int(block.root[r]), 0.0, ())
            frontier, nodes = [root], []
            for d in range(block.gamma):
                logq = torch.log_softmax(cands.logits[r, d], -1).tolist()
                kids = [Node(int(cands.tokens[r, d, k]), p.score + logq[k], p.rank_path + (k,), p)
                        for p in frontier for k in range(min(config.topk, config.max_children))]
                frontier = sorted(kids, key=lambda u: u.key)[:2]
                nodes += frontier
            roots.append(root)
            rows.append(sorted(nodes, key=lambda u: u.key)[: config.budget])
        return assemble(roots, rows, block.device)


    register_builder(BuilderSpec("beam", BeamConfig, False, beam))
''')


def _dartree(args, cwd, path):
    env = {"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "dartree.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, check=False)


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_a_plugin_builder_runs_from_the_command_line_losslessly(tmp_path):
    (tmp_path / "beam_plugin.py").write_text(PLUGIN)
    out = tmp_path / "run"
    done = _dartree(["bench", "--plugin", "beam_plugin", "--model", "tiny-random", "--methods",
                     "beam:budget=6,topk=3,max_children=2", "--datasets", "stdlib", "--num-prompts", "1",
                     "--max-new-tokens", "8", "--no-warmup", "--out", str(out)], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "results.json").read_text())
    assert result["lossless"]
    table = (out / "results.md").read_text()
    assert "beam:budget=6,topk=3,max_children=2" in table and "max_children=2" in table.split("beam:")[1]
    bad = _dartree(["bench", "--plugin", "no_such_plugin", "--methods", "chain"], tmp_path, tmp_path)
    assert bad.returncode == 2 and "--plugin: cannot import 'no_such_plugin'" in bad.stderr
    assert "Traceback" not in bad.stderr
    typo = _dartree(["bench", "--plugin", "beam_plugin", "--model", "tiny-random", "--methods",
                     "beam:max_children=two"], tmp_path, tmp_path)
    assert typo.returncode == 2 and "max_children: expected int, got 'two'" in typo.stderr


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_a_plugin_builder_that_raises_or_breaks_the_contract_is_one_line(tmp_path):
    """Exit 2 and one line naming the builder, as for a plugin that does not import (no traceback)."""
    (tmp_path / "broken_plugin.py").write_text(textwrap.dedent('''
        from dartree.builders import BuilderSpec, TreeConfig, register_builder, builder_spec

        def boom(block, head, config):
            raise RuntimeError("no tree today")

        def rootless(block, head, config):
            tree = builder_spec("chain").ref(block, head, config)
            return type(tree)(tree.tokens + 1, tree.parents, tree.depths, tree.scores, tree.ranks, tree.num_nodes)

        register_builder(BuilderSpec("boom", TreeConfig, False, boom))
        register_builder(BuilderSpec("rootless", TreeConfig, False, rootless))
    '''))
    for name, said in (("boom", "RuntimeError: no tree today"), ("rootless", "ValueError")):
        done = _dartree(["generate", "--plugin", "broken_plugin", "--model", "tiny-random", "--method", name,
                         "--max-new-tokens", "4", "--prompt", "def f"], tmp_path, tmp_path)
        assert done.returncode == 2, done.stderr[-1500:]
        assert "Traceback" not in done.stderr and f"builder {name!r} (a plugin's) raised {said}" in done.stderr
