"""Write the golden files of the current format version that do not exist yet.

Run once when a format version is released: ``python tests/golden/make.py``. Existing files
are never rewritten: every released file must stay readable forever.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from objects import (
    GOLDEN_FILES,
    cupy_golden_object,
    golden_object,
    inband_golden_object,
    small_golden_object,
    tensors_golden_object,
    views_golden_object,
)

import blpickle


def main() -> None:
    directory = os.path.dirname(os.path.abspath(__file__))
    for name, options in GOLDEN_FILES.items():
        path = os.path.join(directory, name)
        if os.path.exists(path):
            print(f"kept    {name}")
            continue
        options = dict(options)
        if options.pop("small", False):
            obj = small_golden_object()
        elif options.pop("views", False):
            obj = views_golden_object()
        elif options.pop("tensors", False):
            obj = tensors_golden_object()
        elif options.pop("cupy", False):
            obj = cupy_golden_object()
        elif options.pop("inband", False):
            obj = inband_golden_object()
        else:
            obj = golden_object(blob=options.pop("blob", False))
        blpickle.dump(obj, path, options.pop("protocol", None), **options)
        print(f"written {name}")


if __name__ == "__main__":
    main()
