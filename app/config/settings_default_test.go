package config

import (
	"reflect"
	"testing"

	"github.com/walcount/walcount/reconcile"
)

// TestTableDefaultsAreDefault holds each default that Table states (the
// help, walcount config and docs/configuration.md show it) to the value
// Default() gives the field: the stated text, parsed as a flag or a
// variable would be, must set the field to what Default() holds. "none"
// states an empty value; an optional value that Default() leaves unset
// (reconcile.interval) must state the default its user applies, and the
// replication URL states that it falls back on the database URL.
func TestTableDefaultsAreDefault(t *testing.T) {
	def := Default()
	// unsetDefaults are the values applied where an optional setting is
	// left nil; each entry names the code that applies it.
	unsetDefaults := map[string]any{
		"reconcile.interval": reconcile.DefaultInterval, // app/daemon/reconcile.go
	}
	checked := 0
	for _, s := range Table {
		if s.Key == "" {
			continue // --config has no field: the file itself
		}
		t.Run(s.Key, func(t *testing.T) {
			got, err := s.field(&def)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case s.Key == "replication_url":
				if s.Default != "the database URL" || got.String() != "" {
					t.Fatalf("Table states %q, Default() holds %q: the replication URL falls back on the database URL", s.Default, got.String())
				}
				c := Default()
				if c.ReplicationConnString() != c.DatabaseURL {
					t.Fatalf("unset, the replication URL is %q, not the database URL %q", c.ReplicationConnString(), c.DatabaseURL)
				}
				return
			case s.Default == "none":
				if !got.IsZero() {
					t.Fatalf("Table states none, Default() holds %v", got.Interface())
				}
				return
			case got.Kind() == reflect.Pointer && got.IsNil():
				want, ok := unsetDefaults[s.Key]
				if !ok {
					t.Fatalf("Default() leaves %s unset and the test knows no default applied in its place", s.Key)
				}
				var c Config
				if err := s.Set(&c, s.Default); err != nil {
					t.Fatalf("Table's default %q: %v", s.Default, err)
				}
				v, _ := s.field(&c)
				if v.Elem().Interface() != want {
					t.Fatalf("Table states %q, the default applied is %v", s.Default, want)
				}
				return
			}
			var c Config
			if err := s.Set(&c, s.Default); err != nil {
				t.Fatalf("Table's default %q: %v", s.Default, err)
			}
			stated, _ := s.field(&c)
			if !reflect.DeepEqual(stated.Interface(), got.Interface()) {
				t.Fatalf("Table states %q (%v), Default() holds %v", s.Default, stated.Interface(), got.Interface())
			}
		})
		checked++
	}
	if checked == 0 {
		t.Fatal("Table has no setting with a key")
	}
}
