"""The benchmark's handlers (a Django app so ``durable.py`` is discovered like any app's)."""
