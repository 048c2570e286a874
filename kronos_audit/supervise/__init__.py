"""``kaudit run``: the supervisor that restarts a program (:mod:`.supervisor`) and what the
two tell each other (:mod:`.protocol`). Below the runtime: they need only the errors.
"""
