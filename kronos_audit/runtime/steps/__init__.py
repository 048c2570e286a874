"""A step from staged state to signed and committed.

The run loop hands each step to a publisher (:mod:`.interface` says what it asks of one):
the signed run's (:mod:`.publisher`) or the replay's (:mod:`.replay`). What a step is on
disk is a format, one checkpoint file (:mod:`.file`) or a directory of one shard per rank
(:mod:`.shards`, with the datasets' layouts and the agreed restore in :mod:`.layouts`),
each committed with the same two-phase protocol (:mod:`.commit`), each meeting of the
ranks under a deadline (:mod:`.deadline`). Around a step: the key and verifier that sign
and check it (:mod:`.signer`), the command its manifest records (:mod:`.command`), what is
pruned (:mod:`.retention`), the rollback guard (:mod:`.rollback`). What a step format is,
the publisher asks of :mod:`.format`.
"""
