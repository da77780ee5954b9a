"""Measured tuning of a model's plan switches (`autofusion tune`); see `search`."""
