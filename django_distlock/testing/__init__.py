"""Test utilities: the contract suite every lock backend passes (needs pytest)."""

from .contract import LockContract, in_thread

__all__ = ["LockContract", "in_thread"]
