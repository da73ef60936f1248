"""`python -m benchmarks ...` from the repository's root: hp_otel's benchmarks (`benchmarks/command.py`)."""

import sys

from benchmarks.command import main

sys.exit(main())
