UPDATE walrelay_consumer_hwm
SET hwm = $5, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND source = $4
