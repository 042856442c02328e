"""Importers from model formats into the graph IR."""
