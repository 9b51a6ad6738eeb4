"""Peer systems dpgate is compared with (each in its own environment)."""
