"""A worker's own state on disk: its crash-safe checkpoint file (worker.py), the last N it
keeps (kept.py), and files handed on to users with their usual mode (shared_files.py)."""
