"""kaudit inside the tools people use: each module plugs into one tool's own extension
point, writes that tool's format unchanged, signs each save as a chained step of a run and
verifies before the tool loads.

- :mod:`kronos_audit.integrations.dcp`: ``torch.distributed.checkpoint``'s storage writer
  and reader (the ``dcp`` extra).

Each module imports its tool at its top, so this package imports none of them: a program
pays for a tool only when it imports that tool's module.
"""
