"""``python -m blpickle``: the ``blpickle`` command (see :mod:`blpickle.cli`)."""

from .cli import main

raise SystemExit(main())
