"""Where a microbatch goes next: the balanced deal of each origin step (the default), the
load-aware next-hop choice (its fallback, and every re-send), and the peer view they choose
from (the membership view minus a local blacklist, with round-trip averages and in-flight
counts)."""
