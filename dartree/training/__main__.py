"""``python -m dartree.training``: train the bundled zoo (see :mod:`dartree.training`)."""

import random

from dartree.training.pipeline import main

if __name__ == "__main__":
    random.seed(0)
    main()
