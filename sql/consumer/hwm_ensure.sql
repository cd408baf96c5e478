INSERT INTO walrelay_consumer_hwm (consumer_group, topic, partition, source, hwm)
SELECT $1, $2, $3, s, '00000000000000000000000000000000'
FROM unnest($4::text[]) AS s
ON CONFLICT DO NOTHING
