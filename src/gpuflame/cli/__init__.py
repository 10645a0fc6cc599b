"""Command-line interface: ``gpuflame COMMAND``; one module per command."""
