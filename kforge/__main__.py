"""`python -m kforge ...` is the `kforge` command."""

from kforge.cli import main

raise SystemExit(main())
