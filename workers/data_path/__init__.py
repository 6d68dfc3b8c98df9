"""The worker's data path (docs/architecture.md §3): its role, messages in and out, microbatches in flight, deadlines."""
