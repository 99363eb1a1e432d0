"""Callbacks that run beside training, the run report, the output check of writing commands."""
