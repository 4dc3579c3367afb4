package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every secret. It is the same string net/url's
// URL.Redacted uses, so masked URLs look alike wherever they come from.
const Mask = "xxxxx"

var (
	// userinfoPassword matches "scheme://user:secret@" anywhere in a
	// string. The secret part is greedy up to the last "@" before
	// whitespace, because a password written without percent-encoding may
	// itself contain "@", "/" or ":".
	userinfoPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://)([^\s:/@]*):\S*@`)

	// keyValueSecret matches key=value pairs whose key names a secret, as in
	// libpq's "password='...'" or a URL query's "&password=...". A quoted
	// value runs to its closing quote (or to the end, if it has none); an
	// unquoted one runs to the next whitespace, which may swallow a
	// following "&key=value": hiding too much is the safe side.
	keyValueSecret = regexp.MustCompile(`(?i)((?:^|[\s&?;,])[\w.\-]*(?:pass|secret|token)[\w.\-]*\s*=\s*)('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|\S*)`)
)

// URL returns raw with every password masked. It accepts a postgres://,
// postgresql://, redis:// or rediss:// URL, a libpq key=value connection
// string, or any other text; what cannot be parsed is masked by pattern.
// The result is for people to read: it is not guaranteed to be a valid
// connection string.
func URL(raw string) string {
	if u, ok := parseURL(raw); ok {
		return redactURL(u)
	}
	return redactText(raw)
}

// parseURL parses raw as a URL when it is one on its own: a scheme followed
// by "://" and no whitespace. Anything else (a key=value string, a URL
// embedded in a message) is left to the patterns.
//
// A URL with an "@" after its authority is left to the patterns too. It is
// legal, but it is also what a password with a raw "/", "?" or "#" looks
// like ("redis://:12#34@host" parses as host ":12" and fragment "34@host"),
// and net/url would then print part of the password as a path, query or
// fragment.
func parseURL(raw string) (*url.URL, bool) {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok || strings.ContainsAny(raw, " \t\r\n") {
		return nil, false
	}
	if end := strings.IndexAny(rest, "/?#"); end >= 0 && strings.Contains(rest[end:], "@") {
		return nil, false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return nil, false
	}
	return u, true
}

func redactURL(u *url.URL) string {
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	if u.RawQuery != "" {
		// The query is masked in place, not through url.Values, so that the
		// order and spelling of the other parameters are kept.
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			key, _, hasValue := strings.Cut(p, "=")
			name, err := url.QueryUnescape(key)
			if err != nil {
				name = key
			}
			if hasValue && isSecretKey(name) {
				parts[i] = key + "=" + Mask
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	if u.Fragment != "" {
		// Connection URLs have no use for a fragment; one is most likely the
		// tail of a password that contains a raw "#".
		u.Fragment, u.RawFragment = Mask, ""
	}
	return u.String()
}

func redactText(s string) string {
	s = userinfoPassword.ReplaceAllString(s, "${1}${2}:"+Mask+"@")
	return keyValueSecret.ReplaceAllString(s, "${1}"+Mask)
}

// isSecretKey reports whether a parameter name holds a secret: libpq's
// password and sslpassword, and, to be safe, anything else naming a
// password, a secret or a token.
func isSecretKey(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "pass") || strings.Contains(n, "secret") || strings.Contains(n, "token")
}
