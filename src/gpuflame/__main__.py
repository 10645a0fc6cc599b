"""``python -m gpuflame``."""

from gpuflame.cli.main import main

raise SystemExit(main())
