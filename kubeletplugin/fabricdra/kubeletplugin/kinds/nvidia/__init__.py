"""The NVIDIA family's own modules (issue 31): GPU sharing, dynamic MIG (its profiles, NVML
calls and journal), the container toolkit's CDI specs, the Xid watch, the GPUs seen, the
driver wait. The NVIDIA kinds themselves are `kinds/nvidia_gpu.py` and `kinds/nvidia_mig.py`;
nothing at the kubeletplugin root is NVIDIA-only (tests/unit/test_import_graph.py)."""
