package preflight

import (
	"fmt"
	"io"
	"strings"
)

// Format writes one line per finding, its severity padded so that the
// messages line up:
//
//	ok      wal_level is logical
//	PROBLEM replica identity of public.likes ... — fix: ALTER TABLE ...
//	warning max_slot_wal_keep_size is -1 ... — fix: ALTER SYSTEM ...
//
// A fix of several lines (the statements the tables' owner runs) goes on
// after its finding's line, each further line indented by FixIndent, so
// that it can be copied as it is.
//
// It is meant for people; programs should read the Findings. Write errors
// are ignored: there is nowhere better to report them.
func Format(w io.Writer, findings []Finding) {
	for _, f := range findings {
		line := fmt.Sprintf("%-7s %s", f.Severity, f.Message)
		if f.Fix != "" && f.Severity != OK {
			line += " — fix: " + strings.ReplaceAll(f.Fix, "\n", "\n"+FixIndent)
		}
		_, _ = fmt.Fprintln(w, line)
	}
}

// FixIndent starts each further line of a fix in Format's output.
const FixIndent = "        "
