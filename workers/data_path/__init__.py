"""The worker's data path: microbatches in flight, deadlines."""
