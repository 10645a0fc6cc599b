"""Replay a recorded run through a model of PyTorch's CUDA caching allocator (``gpuflame simulate``).

Its own stage beside analysis/: it reads what formats/ and the model give
(a snapshot's trace, a profile's event history) and returns data; the
command renders it. Nothing in capture/ imports it.

- ``settings``: PYTORCH_CUDA_ALLOC_CONF, parsed as PyTorch parses it.
- ``allocator``: the caching allocator, block by block; ``blocks``: what it moves (sizes, segments, blocks, pools).
- ``snapshot``: a snapshot's trace replayed and compared with the recording.
- ``history``: a gpuflame profile's event history replayed.
- ``outcome``: one device's answer and the stacks it names.
- ``replay``: the front: read an input, run every device, try other settings.
- ``gpus``: ``--gpu-memory`` sizes and GPU names.
- ``fragmentation``: the ``fragmentation`` profile at the reserved peak.
- ``explain``: why a setting moves the reserved peak, in bytes per cause measured at the peak.
"""
