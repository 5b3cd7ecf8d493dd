"""The models: the target through mlx-lm (taps, caches, the head the drafter borrows), the DFlash
drafter and its configs, checkpoint checks, the doctor, loading a pair, and where models live."""
