"""Offline demo: a small bundled web served on loopback."""
