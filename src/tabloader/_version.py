"""The version of tabloader, here so that modules below the package's root can read it."""

__version__ = "0.1.0"
