"""``python -m hami_trio`` runs the ``hami-trio`` command line."""

import sys

from hami_trio.cli.main import main

sys.exit(main())
