"""Signing: the one predicate builder, for a checkpoint in one file or a sharded step
(``predicate``); signing it into a manifest (``sign``); and ``kaudit snapshot``, which
signs checkpoints that exist (``snapshot``).
"""
