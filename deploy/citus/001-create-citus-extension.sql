-- Run once by the postgres image's entrypoint when a node's data folder is created.
CREATE EXTENSION IF NOT EXISTS citus;
