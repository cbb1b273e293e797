"""The four policies; each is a pure function ``(snapshot, policy, now) -> Plan``."""
