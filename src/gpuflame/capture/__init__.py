"""Capture: one module per source of memory events, and the session that writes them."""
