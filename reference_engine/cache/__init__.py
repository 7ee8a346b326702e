"""Caches: the device tensors (`tensors.ModelCaches`), the integer-only block manager and slot pool, and the K/V write."""
