package servers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles are the PEM files of a certificate authority made for a test,
// and of a server and a client certificate it signed. Every file is
// readable by the servers' OS user.
type TLSFiles struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA certificate that signed ServerCert and ClientCert.
	CAFile string
	// ServerCert and ServerKey are valid for localhost, 127.0.0.1 and ::1.
	ServerCert, ServerKey string
	// ClientCert and ClientKey have the common name ClientName.
	ClientCert, ClientKey string
	ClientName            string
}

// MakeTLSFiles creates a fresh CA under dir and signs a server certificate
// for the loopback names and a client certificate for clientName. Keys are
// ECDSA P-256; certificates are valid for a day.
func MakeTLSFiles(dir, clientName string) (TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return TLSFiles{}, fmt.Errorf("make tls files: %w", err)
	}
	f := TLSFiles{
		Dir:        dir,
		CAFile:     filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"),
		ServerKey:  filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"),
		ClientKey:  filepath.Join(dir, "client.key"),
		ClientName: clientName,
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, fmt.Errorf("make tls files: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "walcount test CA"},
		NotBefore:             now,
		NotAfter:              now.Add(25 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("make tls files: ca: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, fmt.Errorf("make tls files: ca: %w", err)
	}
	if err := writePEM(f.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return f, err
	}
	leaf := func(cn string, server bool, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now,
			NotAfter:     now.Add(25 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		}
		if server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		// PostgreSQL refuses a key file that others can read; the caller
		// chowns it to the server's user when that is another user.
		return writePEM(keyPath, "PRIVATE KEY", keyDER, 0o600)
	}
	if err := leaf("localhost", true, f.ServerCert, f.ServerKey); err != nil {
		return f, fmt.Errorf("make tls files: server certificate: %w", err)
	}
	if err := leaf(clientName, false, f.ClientCert, f.ClientKey); err != nil {
		return f, fmt.Errorf("make tls files: client certificate: %w", err)
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
