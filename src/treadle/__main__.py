"""`python -m treadle`: same as the `treadle` command."""

from __future__ import annotations

from treadle.cli.main import main

main()
