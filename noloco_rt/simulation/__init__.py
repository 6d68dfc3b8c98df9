"""`noloco-rt simulate`: R replicas × S stages in one process, on the same pure functions as
the workers; it reads the corpus and writes a run directory, so it lives apart from algo/."""
