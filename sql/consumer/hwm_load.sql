SELECT h.topic, h.partition, h.source, h.hwm
FROM walrelay_consumer_hwm h
JOIN unnest($2::text[], $3::int4[]) AS a(topic, partition)
  ON a.topic = h.topic AND a.partition = h.partition
WHERE h.consumer_group = $1
ORDER BY h.topic, h.partition, h.source
