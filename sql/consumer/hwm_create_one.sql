INSERT INTO walrelay_consumer_hwm (consumer_group, topic, partition, source, hwm)
VALUES ($1, $2, $3, $4, '00000000000000000000000000000000')
ON CONFLICT DO NOTHING
