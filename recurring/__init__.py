"""Recurring schedules: a cron expression or a fixed interval in a time zone, each tick
one message through the broker's normal write path (``recurring.model``,
``recurring.book``, ``recurring.engine``)."""
