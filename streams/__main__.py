"""`python -m streams` runs the `draftgen` command line (what child processes use)."""

import sys

from streams.cli.main import main

sys.exit(main())
