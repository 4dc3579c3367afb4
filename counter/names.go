package counter

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// MaxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, so a longer name in the configuration could never match a
// catalog entry.
const MaxIdentLen = 63

var (
	// plainIdent is an unquoted SQL identifier; PostgreSQL folds it to
	// lower case.
	plainIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)
	// canonicalIdent is an identifier that needs no quotes in the
	// canonical "schema.table" form.
	canonicalIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)
)

// SplitTable splits a table name of the configuration into schema and
// table. An unqualified name is in schema public. Unquoted parts are folded
// to lower case as PostgreSQL does; double-quoted parts are kept as they
// are ("My""Table" is My"Table). Names that Validate rejects are returned
// as they are, in schema public.
func SplitTable(name string) (schema, table string) {
	s, t, err := parseTable(name)
	if err != nil {
		return "public", name
	}
	return s, t
}

// parseTable parses "table" or "schema.table", each part a plain or a
// double-quoted identifier.
func parseTable(name string) (schema, table string, err error) {
	parts, err := splitQualified(name)
	if err != nil {
		return "", "", fmt.Errorf("%q is not a table name: %w", name, err)
	}
	switch len(parts) {
	case 1:
		return "public", parts[0], nil
	case 2:
		return parts[0], parts[1], nil
	default:
		return "", "", fmt.Errorf("%q is not a table name: want table or schema.table", name)
	}
}

// ParseIdent parses one plain or double-quoted identifier and returns the
// name PostgreSQL would store.
func ParseIdent(s string) (string, error) {
	parts, err := splitQualified(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a column name: %w", s, err)
	}
	if len(parts) != 1 {
		return "", fmt.Errorf("%q is not a column name: it must not be qualified", s)
	}
	return parts[0], nil
}

// splitQualified splits a dotted name into identifiers.
func splitQualified(s string) ([]string, error) {
	var parts []string
	for {
		var part string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, errors.New("unterminated double quote")
				}
				b.WriteString(s[i : i+j])
				i += j + 1
				if i < len(s) && s[i] == '"' { // "" is an escaped quote
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			part, s = b.String(), s[i:]
			if part == "" {
				return nil, errors.New("empty quoted identifier")
			}
		} else {
			end := strings.IndexByte(s, '.')
			if end < 0 {
				end = len(s)
			}
			part, s = s[:end], s[end:]
			if !plainIdent.MatchString(part) {
				return nil, fmt.Errorf("%q is not an identifier: use letters, digits, _ and $, or double quotes", part)
			}
			part = strings.ToLower(part)
		}
		if len(part) > MaxIdentLen {
			return nil, fmt.Errorf("%q is longer than %d bytes", part, MaxIdentLen)
		}
		parts = append(parts, part)
		if s == "" {
			return parts, nil
		}
		if s[0] != '.' {
			return nil, errors.New("unexpected text after a quoted identifier")
		}
		s = s[1:]
	}
}

// CanonicalTable writes schema.table, quoting a part only when an unquoted
// form would read differently.
func CanonicalTable(schema, table string) string {
	return canonicalIdentText(schema) + "." + canonicalIdentText(table)
}

func canonicalIdentText(s string) string {
	if canonicalIdent.MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// sortedKeys returns the keys of m in order, so that output is stable.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
