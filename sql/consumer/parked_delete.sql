DELETE FROM walrelay_consumer_parked WHERE id = $1
