"""Validation of skills and contracts, one module per concern; `runner.validate_repository` runs them all.

Kept import-free so `toolbox.knowledge_base` can use `toolbox.validate.schema` without a cycle.
"""
