"""`python -m autofusion`: the same command line as `autofusion`."""

from autofusion.tools.cli.main import main

raise SystemExit(main())
