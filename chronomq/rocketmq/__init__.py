"""The RocketMQ 5 front: ``apache.rocketmq.v2.MessagingService`` on its own port over the
same broker, so the official RocketMQ 5 clients send delayed messages and pop here."""
