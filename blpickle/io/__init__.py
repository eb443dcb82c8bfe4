"""Where bytes come from and go to: records read in order or by byte range from memory, memory
maps, files and URLs (`.sources`, `.ranges`), paths opened and replaced atomically
(`.files`), and fsspec URLs (`.remote`). Imports only `blpickle.format` and `blpickle.errors`."""
