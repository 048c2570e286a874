"""A step from staged state to signed and committed.

The run loop hands each step to a publisher (:mod:`.interface` says what it asks of one):
the signed run's (:mod:`.publisher`) or the replay's (:mod:`.replay`). What a step is on
disk is a format, one checkpoint file (:mod:`.file`) or a directory of one shard per rank
(:mod:`.shards`, with the datasets' layouts and the agreed restore in :mod:`.layouts`),
each committed with the same two-phase protocol (:mod:`.commit`). Around a step: the key
and verifier that sign and check it (:mod:`.signer`), what is pruned (:mod:`.retention`).
"""
