package preflight

import (
	"fmt"
	"io"
)

// Format writes one line per finding, its severity padded so that the
// messages line up:
//
//	ok      wal_level is logical
//	PROBLEM replica identity of public.likes ... — fix: ALTER TABLE ...
//	warning max_slot_wal_keep_size is -1 ... — fix: ALTER SYSTEM ...
//
// It is meant for people; programs should read the Findings. Write errors
// are ignored: there is nowhere better to report them.
func Format(w io.Writer, findings []Finding) {
	for _, f := range findings {
		line := fmt.Sprintf("%-7s %s", f.Severity, f.Message)
		if f.Fix != "" && f.Severity != OK {
			line += " — fix: " + f.Fix
		}
		_, _ = fmt.Fprintln(w, line)
	}
}
