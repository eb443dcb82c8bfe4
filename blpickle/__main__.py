"""``python -m blpickle``: the ``blpickle`` command (see `blpickle.cli`)."""

from .cli import main

raise SystemExit(main())
