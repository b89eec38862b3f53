"""Fast, batched, device-agnostic reference implementations (torch).

This layer imports neither ``tabular`` nor ``specs`` (docs/architecture.md, contract): it is checked
against them only in ``tests/``.
"""

__version__ = "0.1.0"
