"""The one exception type for bad input anywhere in the framework.

Every validation failure is a :class:`ConfigError` whose message is a single line naming the offending field (as a
dotted path, e.g. ``hardware.hbm_bandwidth_bytes_per_s``) and the value that was rejected. Entry points in
``codesign/`` print that line and exit non-zero; nothing else needs to know how the error is shown.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input: a wrong type, an unknown key, a non-physical number, an unknown preset name."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)
