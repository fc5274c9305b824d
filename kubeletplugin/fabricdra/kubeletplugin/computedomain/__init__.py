"""The node side of `compute-domain.fabricdra.io`: the kubelet plugin that injects a domain's
IMEX channel into its workloads (driver.py, channels.py) and the per-domain IMEX daemon
(imex.py, daemon.py) that reports its readiness to the controller (report.py)."""
