"""The names of the controller informers' indexes (kube/informer.py `add_index`; wired in
manager.py). A reconcile reads the objects of its own node or domain through them, never the
whole cache: at 5,000 nodes a node reconcile that scanned every claim and Lease, run for every
node on each resync, outlasted the resync period (docs/compute-domains.md, "Caches and
indexes")."""

BY_NODE = "node"  # claims: nodes they are allocated on; slices: their node; Leases: reported node
BY_DOMAIN = "domain"  # claims, Leases: the domain UID of their fabricdra label
BY_FABRIC = "fabric"  # Nodes: their NVLink fabric domain label
BY_UID = "uid"  # ComputeDomains: their UID
