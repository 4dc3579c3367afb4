-- walcount setup --print-sql: what the owner of the tables runs once for walcount's role <role>
-- (slot "<slot>", publication "walcount", database <database>). Run it as the tables' owner:
--     psql -v ON_ERROR_STOP=1 -f this-file.sql
-- then run walcount setup as <role>: it creates the slot and leaves what exists and matches alone.
-- Each group says what it needs; a group that has nothing to do says so.

-- 1. walcount's state schema is at version 6, owned by <role>: nothing to do.

-- 2. Privileges on the tables: <role> has every one walcount needs.

-- 3. Replica identity: every source's identity carries the counters' columns: nothing to do.

-- 4. Publication walcount already holds exactly what walcount needs: nothing to do (setup never alters it).

-- 5. Replication slot "<slot>" exists: nothing to do.
