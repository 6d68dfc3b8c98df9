"""A run's curves: loss and spread drawn as PNG (png.py), and scalars for TensorBoard and W&B
offline, with every tag name (scalar_log.py, the only module that imports either)."""
