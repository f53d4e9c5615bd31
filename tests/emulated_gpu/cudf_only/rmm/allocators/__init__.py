"""Allocator hooks that route other libraries' allocations through rmm."""

__emulated__ = True
