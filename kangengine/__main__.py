"""``python -m kangengine``: the ``kangengine`` command (:mod:`kangengine.cli`)."""

import sys

from .cli import main

sys.exit(main())
