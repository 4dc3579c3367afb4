package servers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// DefaultStandbyName is the application_name and physical slot name of a
// standby whose StandbyOptions.Name is empty.
const DefaultStandbyName = "walcount_standby"

// standbyPollInterval is how often the wait helpers ask a server for its
// progress. Each poll is a query, so it is coarser than pollInterval.
const standbyPollInterval = 10 * time.Millisecond

// slotNameRE is what PostgreSQL accepts as a replication slot name.
var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ErrNotStandby is returned by the standby methods of a cluster that
// StartStandby did not make.
var ErrNotStandby = errors.New("not a standby made by StartStandby")

// StandbyOptions configures StartStandby. The zero value is valid.
type StandbyOptions struct {
	// Name is the standby's application_name on the primary and the name
	// of the physical replication slot it streams from, which StartStandby
	// creates on the primary. It must be a valid slot name (lower-case
	// letters, digits and underscores). "" means DefaultStandbyName.
	Name string
	// Port is the standby's TCP port on 127.0.0.1. 0 means a random free
	// port.
	Port int
	// Settings override the standby's settings (see StandbySettings), e.g.
	// {"sync_replication_slots": "off"} to call pg_sync_replication_slots()
	// by hand, or {"recovery_min_apply_delay": "1h"} for a standby that
	// receives WAL but does not apply it.
	Settings map[string]string
	// Logger receives start and stop events. nil means no logging.
	Logger *zap.Logger
}

// standbyInfo is what a standby remembers about how it was made.
type standbyInfo struct {
	primary *Postgres
	slot    string
}

// StandbySettings returns the settings StartStandby gives a standby of a
// primary of the given major version and port, before
// StandbyOptions.Settings: streaming from the primary through the physical
// slot, hot standby with feedback, and from PostgreSQL 17 on the
// synchronisation of failover logical slots, which needs dbname in
// primary_conninfo and hot_standby_feedback
// (https://www.postgresql.org/docs/17/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS-SYNCHRONIZATION).
// synchronized_standby_slots is cleared on 17+ because the copy inherits the
// primary's postgresql.auto.conf, and a promoted standby must not wait for a
// slot that only its old primary has. wal_retrieve_retry_interval is 200ms
// instead of 5s, so that a standby whose primary restarted (as every
// StartStandby restarts it) streams again at once.
func StandbySettings(major, primaryPort int, name string) map[string]string {
	s := map[string]string{
		"primary_conninfo":            standbyConninfo(primaryPort, name, ""),
		"primary_slot_name":           name,
		"hot_standby":                 "on",
		"hot_standby_feedback":        "on",
		"wal_retrieve_retry_interval": "200ms",
	}
	if major >= 17 {
		s["sync_replication_slots"] = "on"
		s["synchronized_standby_slots"] = ""
	}
	return s
}

// StartStandby makes a streaming-replication standby of the running cluster
// p and starts it. There is no pg_basebackup among the binaries this package
// may run (the npm builds lack it), so the standby is a cold copy: it
// creates a physical slot named opt.Name on p, stops p (fast: its clients
// are disconnected), copies its data directory, starts p again on the same
// port and starts the copy in standby mode (standby.signal) with
// StandbySettings. The copy's replication slots are removed, since a
// standby must get its logical slots by synchronisation, not by inheriting
// stale copies.
//
// The standby is a *Postgres like any other: Stop, Start, Close and URL
// work, and so do Promote, WaitReplayed and WaitCaughtUp. Close leaves the
// physical slot on the primary. On PostgreSQL 17+, a test of failover slots
// also sets synchronized_standby_slots on the primary to the slot, with
// p.SetSynchronizedStandbySlots(ctx, standby.StandbySlot()).
//
// Restarting the primary disconnects its clients and its existing standbys.
// Their WAL receivers reconnect within wal_retrieve_retry_interval, but a
// slot sync worker (PostgreSQL 17+) that lost its connection is restarted
// by the postmaster only 10 s later: make the standby whose worker a test
// relies on last.
func (p *Postgres) StartStandby(ctx context.Context, opt StandbyOptions) (_ *Postgres, err error) {
	name := opt.Name
	if name == "" {
		name = DefaultStandbyName
	}
	if !slotNameRE.MatchString(name) {
		return nil, fmt.Errorf("start standby: invalid name %q: want a replication slot name (a-z, 0-9, _)", name)
	}
	for k := range opt.Settings {
		if !settingNameRE.MatchString(k) {
			return nil, fmt.Errorf("start standby: invalid setting name %q", k)
		}
	}
	if !p.Running() {
		return nil, fmt.Errorf("start standby: the primary is not running")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*DefaultStartTimeout)
		defer cancel()
	}
	// Reserving WAL now keeps every segment the standby will need, from
	// before the shutdown checkpoint it starts at.
	if err := p.exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", name); err != nil {
		return nil, fmt.Errorf("start standby: create physical slot on the primary: %w", err)
	}
	s := &Postgres{
		binDir: p.binDir, major: p.major, id: p.id, tls: p.tls, port: opt.Port, logger: opt.Logger,
		standby: &standbyInfo{primary: p, slot: name},
	}
	if s.logger == nil {
		s.logger = zap.NewNop()
	}
	defer func() {
		if err != nil {
			s.removeAll()
			// Best effort: a forgotten slot would retain the primary's WAL
			// for as long as the primary lives.
			dropCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = p.exec(dropCtx, "SELECT pg_drop_replication_slot($1)", name)
		}
	}()
	if err := s.prepareDirs(""); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	if err := p.coldCopy(ctx, s.dataDir); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	if err := s.configureStandby(p, name, opt.Settings); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	return s, nil
}

// coldCopy stops p fast, copies its data directory to dst and starts p
// again, whatever happened to the copy: a test's primary must not stay down
// because its standby failed.
func (p *Postgres) coldCopy(ctx context.Context, dst string) error {
	if err := p.Stop(ctx, StopFast); err != nil {
		return err
	}
	copyErr := copyDir(p.dataDir, dst)
	if err := p.Start(ctx); err != nil {
		return errors.Join(copyErr, fmt.Errorf("restart primary: %w", err))
	}
	return copyErr
}

// configureStandby turns the cold copy in s.dataDir into a standby of p:
// it removes what belongs to the primary's running instance and its slots,
// writes standby.signal and the settings.
func (s *Postgres) configureStandby(p *Postgres, name string, extra map[string]string) error {
	for _, f := range []string{"postmaster.pid", "postmaster.opts"} {
		if err := os.Remove(filepath.Join(s.dataDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s from the copy: %w", f, err)
		}
	}
	slots := filepath.Join(s.dataDir, "pg_replslot")
	entries, err := os.ReadDir(slots)
	if err != nil {
		return fmt.Errorf("read the copy's pg_replslot: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(slots, e.Name())); err != nil {
			return fmt.Errorf("remove the copy's slot %s: %w", e.Name(), err)
		}
	}
	if err := writeOwned(filepath.Join(s.dataDir, "standby.signal"), nil, 0o600, s.id); err != nil {
		return err
	}

	// walcount.conf keeps the primary's settings, which a standby needs at
	// least as high (max_connections, max_wal_senders...), with the
	// standby's own socket directory.
	settings := maps.Clone(p.settings)
	if settings == nil {
		settings = DefaultPostgresSettings()
	}
	settings["unix_socket_directories"] = s.socketDir
	if err := writeOwned(filepath.Join(s.dataDir, confFile), []byte(formatSettings(settings)), 0o600, s.id); err != nil {
		return err
	}
	s.settings = settings

	// The standby settings go to postgresql.auto.conf, which is read last,
	// so that they override whatever the primary had there.
	standby := StandbySettings(s.major, p.Port(), name)
	if s.tls != nil {
		standby["primary_conninfo"] = standbyConninfo(p.Port(), name, filepath.Join(s.dataDir, tlsCAName))
	}
	maps.Copy(standby, extra)
	path := filepath.Join(s.dataDir, "postgresql.auto.conf")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read postgresql.auto.conf: %w", err)
	}
	return writeOwned(path, []byte(rewriteAutoConf(string(old), standby)), 0o600, s.id)
}

// standbyConninfo returns the primary_conninfo of a standby. With caFile,
// the standby verifies the primary's certificate against it; it then names
// the primary localhost and connects to hostaddr 127.0.0.1, because libpq
// before PostgreSQL 15 ignores the IP addresses in a certificate and would
// refuse host=127.0.0.1.
func standbyConninfo(primaryPort int, name, caFile string) string {
	kv := [][2]string{{"host", "127.0.0.1"}}
	if caFile != "" {
		kv = [][2]string{{"host", "localhost"}, {"hostaddr", "127.0.0.1"}}
	}
	kv = append(kv, [][2]string{
		{"port", strconv.Itoa(primaryPort)},
		{"user", "postgres"},
		{"dbname", "postgres"},
		{"application_name", name},
	}...)
	if caFile != "" {
		kv = append(kv, [2]string{"sslmode", "verify-full"}, [2]string{"sslrootcert", caFile})
	}
	return formatConninfo(kv)
}

// formatConninfo renders libpq key=value pairs, quoting the values that
// need it (empty ones, and those with spaces, quotes or backslashes) so that
// they survive.
func formatConninfo(kv [][2]string) string {
	parts := make([]string, len(kv))
	for i, p := range kv {
		v := p[1]
		if v == "" || strings.ContainsAny(v, " \t\n'\\") {
			v = strings.ReplaceAll(v, `\`, `\\`)
			v = strings.ReplaceAll(v, `'`, `\'`)
			v = "'" + v + "'"
		}
		parts[i] = p[0] + "=" + v
	}
	return strings.Join(parts, " ")
}

// StandbySlot returns the name of the physical slot the standby streams
// from on its primary, or "" for a cluster that is not a standby.
func (p *Postgres) StandbySlot() string {
	if p.standby == nil {
		return ""
	}
	return p.standby.slot
}

// Promote promotes the standby to a primary with `pg_ctl promote -w` and
// waits until it accepts writes. ctx bounds the wait; with no deadline,
// DefaultStartTimeout applies.
func (p *Postgres) Promote(ctx context.Context) error {
	if p.standby == nil {
		return fmt.Errorf("promote: %w", ErrNotStandby)
	}
	if !p.Running() {
		return fmt.Errorf("promote: the standby is not running")
	}
	ctx, cancel := withStartTimeout(ctx)
	defer cancel()
	deadline, _ := ctx.Deadline()
	// A promote request that reaches the server while it restarts after
	// a child's crash (a WAL receiver killed, say) is lost: the startup
	// process that would act on it does not exist yet, and it looks at the
	// promote file only when signalled. So the request is sent again every
	// 15 s until the deadline; a request that did go through but took
	// longer (pg_ctl then finds the server out of standby mode) is done.
	for {
		secs := max(1, min(15, int(time.Until(deadline).Seconds())))
		// pg_ctl refuses to run as root, like postgres; it runs as the
		// server's user, which owns the data directory it writes the
		// promote file to.
		cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, "pg_ctl"),
			"promote", "-D", p.dataDir, "-w", "-t", strconv.Itoa(secs))
		cmd.Dir = p.base
		cmd.Env = serverEnv()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.id.cred}
		out, err := cmd.CombinedOutput()
		if err == nil || strings.Contains(string(out), "not in standby mode") {
			break
		}
		if time.Until(deadline) <= time.Second || !strings.Contains(string(out), "did not promote in time") {
			return fmt.Errorf("promote: pg_ctl promote: %w: %s\nlog:\n%s", err, strings.TrimSpace(string(out)), p.LogTail(20))
		}
		p.logger.Info("postgres did not promote yet; asking again", zap.Int(logKeyPort, p.Port()))
	}
	// pg_ctl -w returns once pg_control says "in production"; a session
	// sees the end of recovery a moment later.
	err := p.poll(ctx, "SELECT NOT pg_is_in_recovery()")
	if err != nil {
		return fmt.Errorf("promote: wait for the end of recovery: %w", err)
	}
	p.logger.Info("postgres promoted", zap.Int(logKeyPort, p.Port()))
	return nil
}

// CurrentLSN returns pg_current_wal_lsn() of a primary: a position at or
// after the end of every transaction committed so far.
func (p *Postgres) CurrentLSN(ctx context.Context) (string, error) {
	var lsn string
	if err := p.queryRow(ctx, "SELECT pg_current_wal_lsn()::text", nil, &lsn); err != nil {
		return "", fmt.Errorf("current wal lsn: %w", err)
	}
	return lsn, nil
}

// ReplayLSN returns pg_last_wal_replay_lsn() of a standby: how far it has
// applied the WAL it received.
func (p *Postgres) ReplayLSN(ctx context.Context) (string, error) {
	var lsn *string
	if err := p.queryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text", nil, &lsn); err != nil {
		return "", fmt.Errorf("last wal replay lsn: %w", err)
	}
	if lsn == nil {
		return "", fmt.Errorf("last wal replay lsn: the server is not in recovery")
	}
	return *lsn, nil
}

// WaitReplayed waits until the standby has replayed the WAL up to lsn (a
// pg_lsn such as "0/3000060"), so that what the primary committed before
// lsn is visible on it.
func (p *Postgres) WaitReplayed(ctx context.Context, lsn string) error {
	if err := p.poll(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn); err != nil {
		return fmt.Errorf("wait for replay of %s: %w", lsn, err)
	}
	return nil
}

// WaitCaughtUp waits until the standby has replayed everything its primary
// had written when WaitCaughtUp was called.
func (p *Postgres) WaitCaughtUp(ctx context.Context) error {
	if p.standby == nil {
		return fmt.Errorf("wait for standby: %w", ErrNotStandby)
	}
	lsn, err := p.standby.primary.CurrentLSN(ctx)
	if err != nil {
		return fmt.Errorf("wait for standby: primary: %w", err)
	}
	return p.WaitReplayed(ctx, lsn)
}

// SetSynchronizedStandbySlots sets synchronized_standby_slots (PostgreSQL
// 17+) on the primary to the given physical slots, with ALTER SYSTEM and a
// reload, and waits until a new session sees it. With it, the primary's
// logical walsenders send no change that these standbys have not received,
// so that failover slots synchronised to them are never ahead of them.
func (p *Postgres) SetSynchronizedStandbySlots(ctx context.Context, slots ...string) error {
	if p.major < 17 {
		return fmt.Errorf("set synchronized_standby_slots: PostgreSQL %d has no such setting (17+)", p.major)
	}
	value := strings.Join(slots, ",")
	if err := p.exec(ctx, "ALTER SYSTEM SET synchronized_standby_slots = "+quoteSetting(value)); err != nil {
		return fmt.Errorf("set synchronized_standby_slots: %w", err)
	}
	if err := p.exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("set synchronized_standby_slots: reload: %w", err)
	}
	// The reload is asynchronous: the postmaster rereads the files, then
	// signals its children. Every poll is a new command, before which a
	// backend applies a pending reload.
	if err := p.poll(ctx, "SELECT current_setting('synchronized_standby_slots') = $1", value); err != nil {
		return fmt.Errorf("set synchronized_standby_slots: wait for the reload: %w", err)
	}
	return nil
}

// connect opens a connection to the postgres database as the superuser.
func (p *Postgres) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		return nil, fmt.Errorf("connect to port %d: %w", p.Port(), err)
	}
	return conn, nil
}

// exec runs one statement on a new connection.
func (p *Postgres) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// queryRow runs a query that returns one row on a new connection.
func (p *Postgres) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// poll runs a query that returns a boolean until it returns true or ctx is
// done, on one connection. NULL counts as false: pg_last_wal_replay_lsn()
// is NULL before a standby replayed anything.
func (p *Postgres) poll(ctx context.Context, sql string, args ...any) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	ticker := time.NewTicker(standbyPollInterval)
	defer ticker.Stop()
	for {
		var ok *bool
		if err := conn.QueryRow(ctx, sql, args...).Scan(&ok); err != nil {
			return err
		}
		if ok != nil && *ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
