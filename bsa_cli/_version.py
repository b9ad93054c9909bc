"""bsa's version: a leaf every module may import (the package's `__init__` hands it on)."""

__version__ = "0.1.0"
