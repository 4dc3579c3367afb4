package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PublicationMark is the publication a slot reads as walcount setup last
// saw it: its oid, and a WAL position at which it already existed. A slot
// confirmed before LSN, or a publication with another oid, may decode
// changes made before the publication existed (see
// publication.SlotSees).
type PublicationMark struct {
	OID uint32
	LSN LSN
}

// ReadPublicationMark returns the publication mark of slot; false when
// none is recorded (no checkpoint, or one written by a walcount older than
// state version 6).
func ReadPublicationMark(ctx context.Context, q Querier, slot string) (PublicationMark, bool, error) {
	var (
		oid *uint32
		lsn *string
	)
	err := q.QueryRow(ctx, `SELECT publication_oid, publication_lsn::text FROM walcount.checkpoint WHERE slot_name = $1`, slot).Scan(&oid, &lsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return PublicationMark{}, false, nil
	}
	if err != nil {
		return PublicationMark{}, false, fmt.Errorf("read the publication mark of slot %s: %w", slot, err)
	}
	if oid == nil || lsn == nil {
		return PublicationMark{}, false, nil
	}
	var m PublicationMark
	m.OID = *oid
	if err := m.LSN.Scan(*lsn); err != nil {
		return PublicationMark{}, false, fmt.Errorf("read the publication mark of slot %s: %w", slot, err)
	}
	return m, true, nil
}

// SetPublicationMark records the publication mark of slot.
func SetPublicationMark(ctx context.Context, q Querier, slot string, m PublicationMark) error {
	if _, err := q.Exec(ctx, `UPDATE walcount.checkpoint SET publication_oid = $2, publication_lsn = $3::text::pg_lsn WHERE slot_name = $1`,
		slot, m.OID, m.LSN.String()); err != nil {
		return fmt.Errorf("record the publication mark of slot %s: %w", slot, err)
	}
	return nil
}
