"""The node agent: every CUDA process on a host profiled through uprobes on the driver (eBPF)."""
