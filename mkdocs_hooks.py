"""mkdocs hooks (``hooks:`` in mkdocs.yml): facts the site shows, read from where they live.

- The version, from ``blpickle.__version__``, in the site name (the header and every title).
- The repository link, from ``[project.urls]`` of pyproject.toml (``Repository``, else
  ``Source``), unless mkdocs.yml sets ``repo_url`` itself.
- The benchmark plots, served as ``img/bench/<name>.png`` straight from bench/results, where
  ``python -m bench`` (and ``--replot``) writes them.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from urllib.parse import urlparse

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent
PLOTS = ROOT / "bench" / "results"


def _version() -> str:
    """blpickle's version, imported from this checkout."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("blpickle").__version__
    finally:
        sys.path.remove(str(ROOT))


def _repository() -> str | None:
    """The repository URL of pyproject.toml's ``[project.urls]``, or None."""
    if tomllib is None:
        return None
    with open(ROOT / "pyproject.toml", "rb") as file:
        urls = tomllib.load(file)["project"].get("urls", {})
    return urls.get("Repository") or urls.get("Source")


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.site_name = f"{config.site_name} {_version()}"
    if not config.repo_url and (url := _repository()):
        config.repo_url = url
        config.repo_name = urlparse(url).path.strip("/")
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for plot in sorted(PLOTS.glob("*.png")):
        uri = f"img/bench/{plot.name}"
        if (stale := files.get_file_from_path(uri)) is not None:
            files.remove(stale)
        files.append(File.generated(config, uri, abs_src_path=str(plot)))
    return files
