"""Train the bundled zoo from scratch on the CPU: ``python -m dartree.training``.

Stages, one module each (resumable; a finished stage is skipped on the next run):

1. ``data``: the running interpreter's standard library (no ``site-packages``, no test suites), split
   train / validation by a hash of each file's path; a byte-level BPE tokenizer; token ids cached.
2. ``target``: a small ``Qwen3ForCausalLM`` trained for a wall-clock budget (the schedule follows the
   fraction of the budget spent, stored in the checkpoint, so a resume continues it).
3. ``distill``: the frozen target continues corpus prompts: the distillation data.
4. ``drafter``: the DFlash-style drafter (block 16) trained on that data.
5. ``heads``: the GRU (Domino) and Markov (DSpark) correction heads, on the frozen drafter's outputs.
6. ``export``: weights (safetensors) and configs written to ``--out`` (default: ``dartree/models/zoo_weights``).
7. ``tau`` (optional, ``--stages tau``): greedy tau of the exported bundle.

``common`` holds what every stage shares; ``pipeline`` the options and the driver.
"""
