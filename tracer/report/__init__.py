"""Reports: where the time went, per message and per job (``rmqtrace report``, the demo's page).

:mod:`.model` turns spans into numbers, :mod:`.sources` reads spans (JSON lines, Jaeger),
:mod:`.terminal`, :mod:`.html` and :mod:`.png` show them, :mod:`.cli` is the command.
Importing this package is cheap: the CLI imports it to register the subcommand.
"""

from .cli import add_cli
from .html import write_demo_report

__all__ = ["add_cli", "write_demo_report"]
