"""What an operator sees and does: the admin, the live view, statistics, explain, metrics.

Thin shells over the service and the reads they need; every action goes through the same
service functions as code (no job row is written here). ``durable_jobs.admin`` and
``durable_jobs.durable`` stay where Django's autodiscovery looks for them and import from
here.
"""
