"""Callbacks that run beside training: last.ckpt, the starvation monitor, the prediction writer."""
