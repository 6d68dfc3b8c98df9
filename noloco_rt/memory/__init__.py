"""What a worker holds in memory: the plan from the model's shape (plan.py, pure), the
choice of microbatches in flight and checkpointing that fits a budget (fit.py), and the
storages counted while a stage runs (tracker.py)."""
