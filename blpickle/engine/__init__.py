"""How records and streams are written and read: the compression policy (`.policy`), the one
module that calls Blosc2 (`.chunks`), the thread pool (`.pool`), the record writer and reader
(`.writer`, `.reader`, `.pickle_file`), the pickle stream as the pickler writes it
(`.graph`), the joblib ``"blosc"`` stream (`.joblib_stream`), and what the pickler hands
them (`.buffers`, `.aliases`, `.names`). Imports only `blpickle.format`, `blpickle.io` and
the modules errors, options and arrays (`tests/test_layers.py`)."""
