"""Wait conditions: hold a job before its first slice until a condition clears.

Two tiers, split by who can answer, and the split matters because one tier is free and
the other spawns a process:

* ``{"after": "2026-09-01T09:00:00Z"}`` — an instant, answered from the database clock
  alone: one exact reschedule to the instant, nothing polled, no budget spent.
* ``{"profile": "ticket-closed"}`` — an operator-declared executable answers go / not
  yet / cannot tell / never; polled with a backoff, every run bounded.

Modules, from pure to runtime:

* ``grammar`` — what a legal instant, condition list and profile declaration are; read
  by both the start (to refuse) and the gate (to act), so neither re-derives them.
* ``backoff`` — when the next check runs, from elapsed hold time alone.
* ``checks`` — run one check executable, contained: a timeout, capped output, a minimal
  environment, optionally another user, and a subreaper supervisor that kills and reaps
  every descendant when the check exits (docs/waits.rst, "What containment covers").
* ``gate`` — the decision at pickup, before the handler's first slice.
* ``explain`` — the one plain-words answer to "what is this held job waiting for?".

This package imports nothing of Django's models at import time: ``conf`` reads the
profile declarations through ``grammar``.
"""
