"""Train the bundled zoo from scratch on the CPU: ``python -m dartree.training``.

Stages, one module each (each resumable; a finished stage is skipped on the next run):

1. ``data``: the Python standard library of the running interpreter (``*.py`` files, not
   ``site-packages`` and not the test suites), split train / validation by a hash of the file's
   relative path; a byte-level BPE tokenizer trained with ``tokenizers``; token ids cached.
2. ``target``: a small ``Qwen3ForCausalLM`` trained for a wall-clock budget (the learning rate
   follows the fraction of the budget spent, which the checkpoint stores, so a resume continues
   the same schedule).
3. ``distill``: the frozen target greedily continues corpus prompts; those continuations are the
   distillation data (teacher forcing on them is exactly the target's greedy labels).
4. ``drafter``: the DFlash-style drafter (block 16) trained on that data.
5. ``heads``: the GRU (Domino) and Markov (DSpark) correction heads, trained on the frozen
   drafter's block outputs against the same greedy labels.
6. ``export``: weights (safetensors) and configs written to ``--out`` (default: the package's
   ``dartree/models/zoo_weights/<name>``).
7. ``tau`` (optional, ``--stages tau``): greedy tau of the exported bundle.

``common`` holds the schedule and the optimizer step every stage shares; ``pipeline`` the options
and the driver.  Everything runs with ``torch.set_num_threads(--threads)``; progress bars go to stderr.
"""
