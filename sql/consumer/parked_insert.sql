INSERT INTO walrelay_consumer_parked
  (consumer_group, topic, partition, kafka_offset, idempotency_key, source,
   kafka_key, payload, header_names, header_values, error, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (consumer_group, topic, partition, source, idempotency_key)
  WHERE idempotency_key IS NOT NULL
DO UPDATE SET
  kafka_offset = EXCLUDED.kafka_offset, kafka_key = EXCLUDED.kafka_key,
  payload = EXCLUDED.payload, header_names = EXCLUDED.header_names,
  header_values = EXCLUDED.header_values, error = EXCLUDED.error,
  attempts = EXCLUDED.attempts, parked_at = now()
