"""The signed format an outside verifier reads: DSSE envelopes (``dsse``), the shipped JSON
schemas (``schemas``), a manifest's typed predicate (``predicate``), manifests, read and
written one way each (``manifest``), and the revocation statement (``revocation``).

Nothing here knows where keys come from or which are trusted: that is
:mod:`kronos_audit.keys`.
"""
