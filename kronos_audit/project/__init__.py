"""The repository a run belongs to: where it is (:func:`repository.find_project`), its
settings (``.kaudit/config.toml``) and the places kaudit keeps in it (trusted keys,
revocations, patches). Setting a project up also makes it a DVC repository, which is
:mod:`kronos_audit.storage.setup`'s part."""
