"""``python -m treadle``: the ``treadle`` command (``treadle.cli``)."""
import sys

from treadle.cli import main

sys.exit(main())
