"""kaudit inside the tools people use: each module plugs into one tool's own extension
point, writes that tool's format unchanged, signs each save as a chained step of a run and
verifies before the tool loads.

- :mod:`kronos_audit.integrations.dcp`: ``torch.distributed.checkpoint``'s storage writer
  and reader (the ``dcp`` extra);
- :mod:`kronos_audit.integrations.hf`: the Hugging Face Trainer's callback, and the newest
  verified checkpoint to resume from (the ``hf`` extra);
- :mod:`kronos_audit.integrations.lightning`: Lightning's ``CheckpointIO`` plugin (the
  ``lightning`` extra);
- :mod:`kronos_audit.integrations.orbax`: Orbax's post-finalization callback, and a step
  verified before restore (the ``orbax`` extra).

Each module imports its tool at its top, so this package imports none of them: a program
pays for a tool only when it imports that tool's module.
"""
