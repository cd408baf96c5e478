SELECT hwm
FROM walrelay_consumer_hwm
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND source = $4
