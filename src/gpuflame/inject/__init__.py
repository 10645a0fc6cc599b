"""Inside the profiled program: the bootstrap that starts gpuflame in it and its children.

Also the Kubernetes payload installer, which copies that in-process part into a pod.
"""
