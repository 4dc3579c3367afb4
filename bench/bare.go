package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// bareSlot is the second slot, read by the bare reader.
const bareSlot = "bare"

// bareResult is what the bare reader saw.
type bareResult struct {
	elapsed time.Duration
	txns    int64
	inserts int64
	deletes int64
	// sender is the CPU time of the walsender that served the reader.
	sender time.Duration
}

// bareDrain is the floor walcount is compared with: a pglogrepl reader on
// the same transport (a replication connection to a pgoutput slot with
// the same publication and options) that decodes every message with
// pglogrepl.Parse and throws it away. It acknowledges what it received at
// once, which is fine here and wrong for walcount (design rule 3). It
// returns when a transaction ending past end has arrived.
func bareDrain(ctx context.Context, url, publication string, end pglogrepl.LSN) (bareResult, error) {
	return bareDrainOn(ctx, url, publication, bareSlot, end)
}

// bareDrainOn is bareDrain on the slot named slot, with extra pgoutput
// options (such as "binary 'true'").
func bareDrainOn(ctx context.Context, url, publication, slot string, end pglogrepl.LSN, extra ...string) (bareResult, error) {
	var res bareResult
	start := time.Now()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return res, err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return res, fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: append([]string{
			"proto_version '1'",
			"publication_names '" + publication + "'",
			"messages 'true'",
		}, extra...),
	})
	if err != nil {
		return res, fmt.Errorf("start replication: %w", err)
	}
	// A read deadline on the socket, moved once a second, rather than a
	// context per message: with context.Background() pgconn skips its
	// context watcher, which costs a timer and a callback registration per
	// message. A timeout leaves the connection usable.
	netConn := conn.Conn()
	var received pglogrepl.LSN
	var nextStatus time.Time
	ack := func() error {
		nextStatus = time.Now().Add(time.Second)
		if err := netConn.SetReadDeadline(nextStatus); err != nil {
			return err
		}
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: received, WALFlushPosition: received, WALApplyPosition: received,
		})
	}
	if err := ack(); err != nil {
		return res, err
	}
	for {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if time.Now().After(nextStatus) {
			if err := ack(); err != nil {
				return res, err
			}
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			return res, fmt.Errorf("receive: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			if er, ok := msg.(*pgproto3.ErrorResponse); ok {
				return res, pgconn.ErrorResponseToPgError(er)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return res, err
			}
			if ka.ReplyRequested {
				if err := ack(); err != nil {
					return res, err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return res, err
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return res, fmt.Errorf("decode: %w", err)
			}
			switch m := m.(type) {
			case *pglogrepl.InsertMessage:
				res.inserts++
			case *pglogrepl.DeleteMessage:
				res.deletes++
			case *pglogrepl.CommitMessage:
				res.txns++
				received = m.TransactionEndLSN
				if m.TransactionEndLSN > end {
					res.elapsed = time.Since(start)
					// The replication connection's backend is the walsender.
					u, err := procUsage(int(conn.PID()))
					if err != nil {
						return res, fmt.Errorf("walsender usage: %w", err)
					}
					res.sender = u.cpu
					_ = ack()
					return res, nil
				}
			}
		}
	}
}
