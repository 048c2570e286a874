"""Keys: key files (``keyfile``), the user's key home (``home``), trust stores (``store``),
the trust anchors and the keyring one verification uses (``anchors``), and which
revocations count (``revocation``).
"""
