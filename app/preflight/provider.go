package preflight

import (
	"fmt"
	"strings"
)

// CheckProvider reports what a managed PostgreSQL (Amazon RDS and Aurora,
// Google Cloud SQL, Azure, Supabase, Neon) needs, where its settings or
// roles show which one it is.
const CheckProvider = "provider"

// checkProvider recognises a managed database by the settings and roles
// its provider adds (rds.*, cloudsql.*, azure.*, neon.*, the
// supabase_admin role) and reports the provider's own switch for logical
// decoding where it has one. What it cannot see (a parameter group, a
// console setting, a pooler's port) it names for the operator. A server
// with none of these marks gets no finding.
func (r *run) checkProvider() error {
	// pg_settings lists the settings the providers' extensions define; a
	// setting that is only a placeholder (a custom name set with ALTER
	// DATABASE, where no extension defines it) is read by name.
	rows, err := r.conn.Query(r.ctx, `
SELECT name, setting FROM pg_settings
WHERE name LIKE 'rds.%' OR name LIKE 'cloudsql.%' OR name LIKE 'azure.%' OR name LIKE 'neon.%'
UNION
SELECT n, current_setting(n, true)
FROM unnest(ARRAY['rds.logical_replication', 'cloudsql.logical_decoding', 'azure.extensions', 'neon.tenant_id', 'neon.timeline_id']) AS n
WHERE current_setting(n, true) IS NOT NULL AND current_setting(n, true) <> ''
ORDER BY 1`)
	if err != nil {
		return r.queryFailed(CheckProvider, "the provider's settings", err)
	}
	settings := map[string]string{}
	prefixes := map[string]bool{}
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			rows.Close()
			return r.queryFailed(CheckProvider, "the provider's settings", err)
		}
		settings[name] = setting
		prefix, _, _ := strings.Cut(name, ".")
		prefixes[prefix] = true
	}
	if err := rows.Err(); err != nil {
		return r.queryFailed(CheckProvider, "the provider's settings", err)
	}
	var supabase bool
	if err := r.conn.QueryRow(r.ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'supabase_admin')`).Scan(&supabase); err != nil {
		return r.queryFailed(CheckProvider, "the provider's roles", err)
	}
	if prefixes["rds"] {
		r.checkLogicalSwitch(settings, logicalSwitch{
			prefix: "rds", provider: "Amazon RDS or Aurora", setting: "rds.logical_replication",
			onNote: " (wal_level follows it); walcount's role needs rds_replication membership (GRANT rds_replication TO <role>) or rds_superuser",
			fix:    "set rds.logical_replication = 1 in the instance's DB parameter group (Aurora: the DB cluster parameter group) and reboot",
		})
	}
	if prefixes["cloudsql"] {
		r.checkLogicalSwitch(settings, logicalSwitch{
			prefix: "cloudsql", provider: "Google Cloud SQL", setting: "cloudsql.logical_decoding",
			onNote: "; walcount's role needs REPLICATION, which the cloudsqlsuperuser admin grants (ALTER ROLE <role> REPLICATION)",
			fix:    "gcloud sql instances patch <instance> --database-flags=cloudsql.logical_decoding=on (the instance restarts)",
		})
	}
	if prefixes["azure"] {
		r.ok(CheckProvider, "azure.* settings: Azure Database for PostgreSQL; wal_level is a server parameter (set it to logical and restart), and the admin grants walcount's role REPLICATION (ALTER ROLE <role> REPLICATION)")
	}
	if supabase {
		r.ok(CheckProvider, "role supabase_admin exists: Supabase; the replication connection needs the direct connection (db.<project>.supabase.co:5432), not the pooler (Supavisor, port 6543 in transaction mode); with the SQL pool on the pooler, set replication_url to the direct connection")
	}
	if prefixes["neon"] {
		r.warn(CheckProvider, "neon.* settings: Neon; Neon removes inactive replication slots (after about 40 hours by its documentation) and a branch restore drops them: a walcount stopped that long loses its slot",
			"enable logical replication in the Neon project's settings; keep walcount running, alert on walcount_slot_retained_wal_bytes, and set on_slot_loss: recreate (or run walcount setup --recreate-slot) to repair the counters after a loss")
	}
	return nil
}

// logicalSwitch is a provider's own setting for logical decoding, which
// wal_level follows.
type logicalSwitch struct {
	prefix   string // of the provider's settings: rds for rds.*
	provider string // its name in a finding
	setting  string
	// onNote follows "<setting> is <value>" when the switch is on: what
	// else walcount's role needs there.
	onNote string
	fix    string // the fix when it is off
}

// checkLogicalSwitch reports a provider's switch for logical decoding: not
// visible to walcount's role, on, or off (a problem, with the provider's
// fix).
func (r *run) checkLogicalSwitch(settings map[string]string, s logicalSwitch) {
	v, found := settings[s.setting]
	switch {
	case !found:
		r.ok(CheckProvider, fmt.Sprintf("%s.* settings: %s; %s is not visible to this role (the wal_level check says whether logical decoding is on)", s.prefix, s.provider, s.setting))
	case v == "on" || v == "1" || v == "true":
		r.ok(CheckProvider, fmt.Sprintf("%s.* settings: %s; %s is %s%s", s.prefix, s.provider, s.setting, v, s.onNote))
	default:
		r.problem(CheckProvider, fmt.Sprintf("%s.* settings: %s, and %s is %s: wal_level cannot be logical", s.prefix, s.provider, s.setting, v), s.fix)
	}
}
