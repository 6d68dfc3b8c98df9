"""Who is alive: the Redis membership table, stage views, the embedded redis-server."""
