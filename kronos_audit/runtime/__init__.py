"""The run loop: periodic, atomic, asynchronous checkpoints; restore; preemption; supervision."""
