"""Reading a run after the fact: ``kaudit log`` (the runs and their chains), ``kaudit
status`` (where each recorded checkpoint is) and ``kaudit bisect`` (the first step at which
two runs diverge). Nothing here writes a checkpoint or a manifest."""
