"""What produced a checkpoint, as its manifest records it: the environment lock
(:mod:`.environment`), the git state and the patch of uncommitted changes
(:mod:`.gitstate`), and the batch scheduler's job (:mod:`.scheduler`)."""
