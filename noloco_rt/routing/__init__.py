"""Where a microbatch goes next: next-hop choice, and the peer view it chooses from (the
membership view minus a local blacklist, with round-trip averages and in-flight counts)."""
