SELECT kafka_key IS NOT DISTINCT FROM $5::bytea
   AND payload IS NOT DISTINCT FROM $6::bytea
   AND header_names = $7::text[]
   AND header_values IS NOT DISTINCT FROM $8::bytea[]
FROM walrelay_consumer_parked
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND kafka_offset = $4
  AND idempotency_key IS NULL
