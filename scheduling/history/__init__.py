"""Import of a cluster's own job history (Slurm accounting, SWF logs, the shared trace CSV).

``parsers`` is pure (text in, frozen records and skips out; no Django); ``services`` maps
users, accounts and GPU types to the portal's rows and writes the jobs idempotently.
"""
