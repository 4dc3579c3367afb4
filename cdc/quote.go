package cdc

import "strings"

// quoteIdent quotes an identifier for the replication protocol's
// command grammar, which does not take bind parameters.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// quoteLiteral quotes a string literal for the replication command
// grammar.
func quoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}
