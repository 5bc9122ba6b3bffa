"""``python -m tracer``: the ``rmqtrace`` command."""

import sys

from .tools.cli import main

__all__: list[str] = []

sys.exit(main())
