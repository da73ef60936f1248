"""`python -m hp_otel.cli ...`, the same as the `hp-otel` command."""

import sys

from hp_otel.cli import main

sys.exit(main())
