SELECT id, topic, partition, kafka_offset, kafka_key, payload, header_names, header_values, attempts
FROM walrelay_consumer_parked
WHERE consumer_group = $1 AND id > $2
ORDER BY id
LIMIT 1
FOR UPDATE SKIP LOCKED
