SELECT count(*) FROM walrelay_consumer_parked WHERE consumer_group = $1
