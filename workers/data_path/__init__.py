"""The worker's data path (DESIGN §3): its role, messages in and out, microbatches in flight, deadlines."""
