"""Attack suites that cross packages: what an adversary tries through the real CLI and ka.Run."""
