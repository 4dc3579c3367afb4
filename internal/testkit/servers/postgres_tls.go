package servers

import (
	"fmt"
	"os"
	"path/filepath"
)

// tlsHBA is the pg_hba.conf of a cluster started with PostgresOptions.TLS:
// local sockets stay trusted, but TCP connections, replication included,
// must use TLS. A client that asks for sslmode=disable is refused, which is
// what lets a test prove that a connection really used TLS.
const tlsHBA = `# Written by walcount's internal/servers: TCP connections must use TLS.
# TYPE   DATABASE     USER  ADDRESS       METHOD
local    all          all                 trust
local    replication  all                 trust
hostssl  all          all   127.0.0.1/32  trust
hostssl  replication  all   127.0.0.1/32  trust
`

// Names of the TLS files in the data directory. They are relative, so that
// the cold copy StartStandby makes of a data directory finds its own.
const (
	tlsCertName = "walcount-server.crt"
	tlsKeyName  = "walcount-server.key"
	tlsCAName   = "walcount-ca.crt"
)

// writeHBA sets up TLS when files is set, and the pg_hba.conf that goes
// with it. Without TLS, pg_hba.conf is left as the template made it, unless
// an earlier start of the same Dir made it TLS-only: a server without TLS
// would then accept no TCP connection at all.
func (p *Postgres) writeHBA(files *TLSFiles, settings map[string]string) error {
	path := filepath.Join(p.dataDir, "pg_hba.conf")
	if files == nil {
		if cur, err := os.ReadFile(path); err != nil || string(cur) != tlsHBA {
			return nil
		}
		return writeOwned(path, []byte(templateHBA), 0o600, p.id)
	}
	if err := p.installTLS(*files, settings); err != nil {
		return err
	}
	return writeOwned(path, []byte(tlsHBA), 0o600, p.id)
}

// installTLS copies the server certificate, its key and the CA certificate
// into the data directory and adds the settings that use them. Copies,
// rather than the caller's files, because the server's OS user must own the
// key (mode 0600) and reach every file, and the caller's directory (often a
// t.TempDir() of mode 0700 owned by root) allows neither.
func (p *Postgres) installTLS(f TLSFiles, settings map[string]string) error {
	files := []struct {
		src, name string
		mode      os.FileMode
	}{
		{f.ServerCert, tlsCertName, 0o644},
		{f.ServerKey, tlsKeyName, 0o600},
		{f.CAFile, tlsCAName, 0o644},
	}
	for _, file := range files {
		b, err := os.ReadFile(file.src)
		if err != nil {
			return fmt.Errorf("install tls files: %w", err)
		}
		if err := writeOwned(filepath.Join(p.dataDir, file.name), b, file.mode, p.id); err != nil {
			return fmt.Errorf("install tls files: %w", err)
		}
	}
	settings["ssl"] = "on"
	settings["ssl_cert_file"] = tlsCertName
	settings["ssl_key_file"] = tlsKeyName
	settings["ssl_ca_file"] = tlsCAName
	p.tls = &f
	return nil
}
