"""A NIC's place in the scale-out fabric (issue 27): port facts, the neighbour switch, the
rail and the role, each with where it came from (`measured` or `declared`).

    ibport     InfiniBand port facts from sysfs (GUID, subnet prefix, LID, SM LID, rate)
    smp        the IB neighbour from `smpquery` over a directed route (NodeInfo, NodeDesc)
    lldp       IEEE 802.1AB LLDPDUs: the parser, and the raw AF_PACKET listener
    lldpd      the neighbours lldpd heard, from `lldpcli -f json0 show neighbors`
    rails      rail and role from PCI distance to the GPUs
    annotate   all of it joined with the declared topology file, disagreements kept

Everything but the two readers (the raw socket, the subprocess) is pure.
"""
