"""Triton kernels for the decode step, one module per family; each public wrapper has the torch op's
destination-passing signature, validates like it, and is registered for its contract (cuda, triton).
`reference_engine.ops.backend.select_ops` picks them up on CUDA."""
