"""Where bytes come from and go to: one byte-range contract for records in memory, memory maps,
files and URLs (`.ranges`), the sources load reads records from in order (`.sources`, which
offer that contract for their reads out of order), paths opened and replaced atomically
(`.files`), and fsspec URLs (`.remote`). Imports only `blpickle.format` and `blpickle.errors`."""
