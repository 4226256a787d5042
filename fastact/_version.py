"""fastact's version, in one place: pyproject.toml reads it (dynamic version) and fastact exports it."""

__version__ = "0.1.0"
