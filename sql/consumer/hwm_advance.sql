UPDATE walrelay_consumer_hwm AS h
SET hwm = v.hwm, updated_at = now()
FROM unnest($4::text[], $5::text[]) AS v(source, hwm)
WHERE h.consumer_group = $1 AND h.topic = $2 AND h.partition = $3 AND h.source = v.source
RETURNING pg_current_xact_id()::text
