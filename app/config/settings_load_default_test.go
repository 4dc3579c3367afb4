package config

import (
	"reflect"
	"testing"
)

// TestTableDefaultsAreWhatLoadGives: what walcount runs with when nothing
// sets a setting is Load's result with no file, no variable and no flag,
// not Default() itself; TestTableDefaultsAreDefault holds Table to
// Default(), and this holds Load to Default(), setting by setting, so that
// the loader applies no default of its own that Table would not state.
// The config file's default, none, is no file read.
func TestTableDefaultsAreWhatLoadGives(t *testing.T) {
	loaded, err := Load("", mapEnv(nil), nil)
	if err != nil {
		t.Fatalf("Load with nothing set: %v", err)
	}
	if loaded.File != "" || len(loaded.Origin) != 0 {
		t.Errorf("Load with nothing set read file %q, origins %v; Table states the config file's default is none", loaded.File, loaded.Origin)
	}
	def := Default()
	for _, s := range Table {
		if s.Key == "" {
			if s.Default != "none" {
				t.Errorf("Table states the config file's default is %q; with no --config and no %s, Load reads none", s.Default, EnvConfig)
			}
			continue
		}
		got, err := s.field(&loaded)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := s.field(&def)
		if !reflect.DeepEqual(got.Interface(), want.Interface()) {
			t.Errorf("%s: Load with nothing set gives %v, Default() (which Table states as %q) %v", s.Key, got.Interface(), s.Default, want.Interface())
		}
		if g, w := s.Show(loaded), s.Show(def); g != w {
			t.Errorf("%s: walcount config shows %s with nothing set, %s for Default()", s.Key, g, w)
		}
	}
	if !reflect.DeepEqual(loaded.Counters, def.Counters) {
		t.Errorf("Load with nothing set keeps the counters %+v, Default() %+v", loaded.Counters, def.Counters)
	}
}
