"""``python -m realtime serve ...`` is the same as the ``realtime`` console script."""

import sys

from realtime.server.cli import main

sys.exit(main())
