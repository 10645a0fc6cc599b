"""The bootstrap that starts gpuflame inside a program and its children."""
