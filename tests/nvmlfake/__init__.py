"""A fake NVML for one MIG-capable GPU that keeps the real placement rules (tests only)."""
