"""The runtime: what runs slices and keeps their leases.

``worker`` (the claim loop and its slots), ``executor`` (one slice's transitions),
``context`` (what a handler sees), ``heartbeat``, the handler processes (``runner``,
``zygote``, ``child``), wake-ups and the pooler probe (``pooling``), and ``reconciler``.
It may import the domain (``registry``, ``waits``), ``store``, ``db``, the schema and the
pure modules; never the console, the Tasks backend or the management commands.
"""
