SELECT pg_current_xact_id_if_assigned()::text
