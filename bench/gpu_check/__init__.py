"""gpuflame's check on a real GPU: one command, at most 8 files, every part degrading on its own.

The parts, in the order the driver (driver.py) runs them, and the files they write:

- env (part_env.py): nvidia-smi, versions, what is missing -> env.txt
- tests (part_tests.py): pytest tests/gpu -> tests.txt (plain summary), tests.xml (JUnit)
- overhead (part_overhead.py): torch-cuda's cost on a training step and a generate loop -> overhead.md
- snapshots (part_snapshots.py): real allocator snapshots of small models -> snapshots.tar
- simulate (part_simulate.py): simulate's predictions beside the same runs on the GPU -> simulate.md
- agent (part_agent.py): the node agent on the real libcuda.so beside torch-cuda and a snapshot -> agent.md

and the driver's summary.md. models.py builds the models (transformers, or a
pure-torch stand-in), workloads.py runs one (the script that makes the
snapshots), common.py holds what the parts share.
"""
