"""Settings: `Options` (frozen, no I/O), the environment reader (`env`), flag-string parsers (`flags`)."""

from autofusion.config.options import CAPTURE_MODES, SUPER_KERNEL_MODES, Options

__all__ = ["CAPTURE_MODES", "SUPER_KERNEL_MODES", "Options"]
