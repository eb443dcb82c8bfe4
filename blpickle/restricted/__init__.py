"""Restricted loading: the pure-Python unpickler of safe mode and the policy it asks."""

from .policy import SAFE_GLOBALS, Policy
from .unpickler import RestrictedUnpickler

__all__ = ["SAFE_GLOBALS", "Policy", "RestrictedUnpickler"]
