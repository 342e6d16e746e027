"""Periodic jobs: schedules declared in code, fired once per tick by one leader.

``ticks`` is the pure arithmetic (cron expressions, zones, DST, catch-up); ``declare``
keeps the declarations made in code and in ``DURABLE_JOBS["SCHEDULES"]``; ``api`` is the
public API (list, pause, resume, run now, sync). The statements live in ``store.py``
and the loop that fires ticks in ``runtime.scheduler`` (invariant 24).
"""
