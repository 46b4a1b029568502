"""``python -m fortis.cli``: the same as the ``fortis`` console script."""

import sys

from fortis.cli.main import main

sys.exit(main())
