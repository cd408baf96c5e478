INSERT INTO walrelay_consumer_parked
  (consumer_group, topic, partition, kafka_offset, idempotency_key, source,
   kafka_key, payload, header_names, header_values, error, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (consumer_group, topic, partition, kafka_offset)
  WHERE idempotency_key IS NULL
DO NOTHING
