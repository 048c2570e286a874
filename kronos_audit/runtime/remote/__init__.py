"""A run's DVC remote as the runtime uses it: pushing each step (:mod:`.push`), resuming
from the remote (:mod:`.resume`), and fetching a sharded step's shards (:mod:`.shard_fetch`).
"""
