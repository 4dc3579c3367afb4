-- Version 3: the messages walcount acts on travel as rows of a table only
-- its own role may write (design rule 18). pg_logical_emit_message is
-- executable by PUBLIC, even in a READ ONLY transaction, so a message of
-- that kind proves nothing about its sender; a row of this table proves
-- its sender could write walcount's state. Each message is inserted and
-- deleted in the transaction that sends it: the table stays empty, and
-- the insert still reaches the stream with the rest of that transaction.
-- The table is in every walcount publication.
CREATE TABLE walcount.messages (
    id   bigint PRIMARY KEY,
    body text   NOT NULL
);
REVOKE ALL ON walcount.messages FROM PUBLIC;
