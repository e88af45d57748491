"""`python -m mla_export.cli ...`: the same as the `mla-export` command."""

import sys

from .main import main

sys.exit(main())
