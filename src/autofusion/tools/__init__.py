"""Tools on top of the public API: the command line (`cli/`), diagnosis (`diagnose/`), built-in models
(`models/`). Library code never imports from here."""
