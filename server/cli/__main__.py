"""``python -m fortis.server.cli``: the same as the ``fortis`` console script."""

import sys

from fortis.server.cli.main import main

sys.exit(main())
