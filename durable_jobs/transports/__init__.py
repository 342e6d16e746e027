"""Broker transports: RabbitMQ and Redis Streams beside the database (DESIGN §6, invariant 31).

``base`` (the message, the broker interface), ``amqp`` (RabbitMQ) and ``streams`` (Redis
Streams) need no Django: a consumer process can use them alone. ``publishing`` is the
app's side: publish after commit, record the message id, take a cancelled job's message
back, report each queue's health.
"""
