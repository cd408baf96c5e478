UPDATE walrelay_consumer_parked
SET attempts = attempts + 1, error = $2
WHERE id = $1
