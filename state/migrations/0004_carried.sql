-- Version 4: the deltas a flush could not apply now (design rule 2).
--
-- A flush applies the keys whose target rows it can lock at once and
-- carries the others to the next flush: a row the application holds
-- locked (deferred, parked_error NULL), or a key whose UPDATE failed on
-- the row's data (parked: a trigger that raises, a CHECK constraint),
-- retried from retry_at on. Its rows are written in the flush's
-- transaction, with the checkpoint's compare-and-set, so that a carried
-- delta is part of walcount's state exactly as the counter columns are:
-- the counter columns plus these rows hold every delta of the
-- transactions up to W. Reconciliation reads them in its snapshot. since
-- is when the key was first carried.
CREATE TABLE walcount.carried (
    slot_name    text NOT NULL,
    counter      text NOT NULL,
    key          text NOT NULL,
    delta        bigint NOT NULL,
    since        timestamptz NOT NULL DEFAULT now(),
    parked_error text,
    retry_at     timestamptz,
    PRIMARY KEY (slot_name, counter, key)
);
