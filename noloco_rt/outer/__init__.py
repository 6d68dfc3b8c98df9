"""What one outer step is, with no threads: the formula, groups, the correction, peer checks,
and the snapshot that carries a contribution (format, chunks, codecs). Pure, except
snapshot_client (one request). The threads that push, receive and apply: workers/outer/."""
