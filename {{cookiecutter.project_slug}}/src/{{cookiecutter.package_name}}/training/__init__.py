"""Callbacks that run beside training: last.ckpt, runs by name, the starvation monitor, the
prediction writer, the run history and report; the output check of every writing command."""
