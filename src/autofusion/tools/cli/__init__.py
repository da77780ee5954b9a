"""The `autofusion` command: one module per subcommand, shared options in `common`."""
