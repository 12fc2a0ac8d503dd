"""python -m gpuguard: the command line."""

from .cli import main

raise SystemExit(main())
