package config

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PooledSQL reports whether the SQL connections go through a connection
// pooler: replication_url is set to another URL than database_url (a
// replication connection cannot be pooled, so a pooled database_url needs
// one). pgx's default query mode prepares named statements, which
// PgBouncer in transaction mode (before 1.21) does not keep: the statement
// is prepared on one server connection and executed on another. A pooled
// database_url therefore gets QueryExecModeCacheDescribe (unnamed
// statements, descriptions cached, still one round trip), unless its own
// default_query_exec_mode says otherwise. Direct connections keep pgx's
// default.
func (c Config) PooledSQL() bool {
	return c.ReplicationURL != "" && c.ReplicationURL != c.DatabaseURL
}

// ApplyQueryExecMode sets cc's query mode for a pooled database_url (see
// PooledSQL), unless the URL sets default_query_exec_mode itself.
func (c Config) ApplyQueryExecMode(cc *pgx.ConnConfig) {
	if c.PooledSQL() && !strings.Contains(c.DatabaseURL, "default_query_exec_mode") {
		cc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
}

// ConnectSQL opens an SQL connection to database_url for the one-shot
// commands (check, setup, teardown): it uses QueryExecModeCacheDescribe
// whether or not the URL names a pooler, unless the URL sets
// default_query_exec_mode, so that they work through PgBouncer in
// transaction mode even before replication_url is set, and check can say
// what is wrong. They run a few dozen statements: the mode costs them
// nothing that matters.
func (c Config) ConnectSQL(ctx context.Context) (*pgx.Conn, error) {
	return c.ConnectSQLWith(ctx, nil)
}

// ConnectSQLWith is ConnectSQL with runtime parameters sent at connection
// start (they win over the database's and the role's settings). A server
// that refuses them as startup parameters is a pooler (PgBouncer answers
// "unsupported startup parameter"): the connection is opened again
// without them.
func (c Config) ConnectSQLWith(ctx context.Context, params map[string]string) (*pgx.Conn, error) {
	connect := func(params map[string]string) (*pgx.Conn, error) {
		cc, err := pgx.ParseConfig(c.DatabaseURL)
		if err != nil {
			return nil, err
		}
		for k, v := range params {
			cc.RuntimeParams[k] = v
		}
		if !strings.Contains(c.DatabaseURL, "default_query_exec_mode") {
			cc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		return pgx.ConnectConfig(ctx, cc)
	}
	conn, err := connect(params)
	if err != nil && len(params) > 0 && strings.Contains(err.Error(), "unsupported startup parameter") {
		return connect(nil)
	}
	return conn, err
}

// SeparateSlotServer reports whether the replication slot is read and
// written through another URL than the SQL pool: replication_url is set to
// another URL than database_url. It is then either the direct connection
// to a primary that database_url reaches through a pooler, or a hot
// standby that decodes (PostgreSQL 16 and later), where the slot lives
// while heartbeats, flushes, markers and reconciliation go to the primary.
func (c Config) SeparateSlotServer() bool { return c.PooledSQL() }

// SlotConnConfig returns the configuration of an SQL (not replication)
// connection to the server that holds the slot: replication_url without a
// replication parameter, which is for the stream walcount run opens
// itself. Call it only when SeparateSlotServer.
func (c Config) SlotConnConfig() (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(c.ReplicationURL)
	if err != nil {
		return nil, err
	}
	delete(cc.RuntimeParams, "replication")
	cc.RuntimeParams["application_name"] = "walcount"
	return cc, nil
}

// ConnectSlotSQL opens an SQL connection to the server that holds the
// slot: replication_url when SeparateSlotServer, else database_url (as
// ConnectSQL).
func (c Config) ConnectSlotSQL(ctx context.Context) (*pgx.Conn, error) {
	if !c.SeparateSlotServer() {
		return c.ConnectSQL(ctx)
	}
	cc, err := c.SlotConnConfig()
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cc)
}
