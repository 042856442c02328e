"""Code generators (C) and the native build with its on-disk cache."""
