"""treadle's version: one fact, read by the package, the wheel's metadata, saved and
exported models, and ``treadle --version``."""
__version__ = "0.1.0"
