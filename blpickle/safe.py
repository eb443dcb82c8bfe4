"""Restricted loading, the documented face of `blpickle.restricted`: what ``safe=True`` and
``allowed=`` admit."""

from .restricted.policy import SAFE_GLOBALS, Policy

__all__ = ["SAFE_GLOBALS", "Policy"]
