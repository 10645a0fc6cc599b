"""Renderers: the terminal (rich) and the flame tree as JSON."""
