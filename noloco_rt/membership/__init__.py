"""Who is alive: the Redis membership table, the peer view, the embedded redis-server."""
