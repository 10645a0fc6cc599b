"""Renderers: the terminal (rich), SVG, the self-contained HTML page around viewer/, the flame tree as JSON."""
