"""pprof's ``profile.proto`` and gpuflame's reading view of it, with the classes protoc generates from them.

``profile_pb2`` and ``split_profile_pb2`` are generated (``make proto``, by
the pinned ``grpcio-tools``; ``tests/unit/formats/test_pprof_proto.py``
checks they are what it generates) and need the ``protobuf`` runtime: only
the reader (:mod:`gpuflame.formats.pprof_read`) imports them. The profiled
process writes pprof with the standard library (:mod:`gpuflame.formats.pprof`).
"""
