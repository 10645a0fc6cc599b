"""Renderers: terminal (rich), SVG, the HTML page around viewer/, the flame-tree JSON; writers.py: every format."""
