SELECT source, hwm, pg_current_xact_id()::text
FROM walrelay_consumer_hwm
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND source = ANY($4::text[])
ORDER BY source
FOR UPDATE
