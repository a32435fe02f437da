"""``python -m dartree.cli``: the ``dartree`` command."""

import sys

from dartree.console import main

sys.exit(main())
