"""pytest plugin: session fixtures for the real control plane (being written; see issue 3)."""
