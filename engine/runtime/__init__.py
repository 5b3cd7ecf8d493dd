"""Platform plumbing: the optimised BLAS preload (Linux) and the engine's thread-local stream."""
