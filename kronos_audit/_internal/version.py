"""The package's version, written here only: ``kronos_audit.__version__`` gives it,
pyproject.toml reads it (``[tool.setuptools.dynamic]``), and the layers below the package
root that record it (a campaign certificate's ``tool``) import it from here."""

VERSION = "0.1.0"

__all__ = ["VERSION"]
