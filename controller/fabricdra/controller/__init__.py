"""The ComputeDomain controller: one NVLink domain per multi-node job."""
