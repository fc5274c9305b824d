"""Sysfs trees laid out exactly as the kernel lays them out, for hardware that is not here."""
