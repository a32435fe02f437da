"""``python -m dartree.cli``: the ``dartree`` command."""

import sys

from dartree.cli import main

sys.exit(main())
