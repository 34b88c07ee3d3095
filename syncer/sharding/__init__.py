"""Sharding: the replicas share the work, each unit of it under a Lease-backed bucket (``coordinator.py``), in a
group of replicas that renew member Leases (``group.py``), with units spread by rendezvous hashing."""
