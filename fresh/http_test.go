package fresh

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/walcount/walcount/counter"
)

// testCounters is one counter of each kind: a count, a filtered count, a
// sum, a total with no key, a multi-level sum of the count's column, a max,
// a min, and a counter through a parent (expanded as the configuration
// expands it: the level above and the via table's own).
func testCounters() []counter.Counter {
	yes := "t"
	return counter.ExpandThrough([]counter.Counter{
		{Name: "post_likes", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "likes_count"},
		{Name: "post_hearts", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "hearts", Where: map[string]*string{"heart": &yes}},
		{Name: "post_score", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "score", Sum: "w"},
		{Name: "site_likes", Source: "public.likes", Target: "public.site", TargetKey: "id", Column: "likes", TargetRow: "1"},
		{Name: "user_likes", Source: "public.posts", Key: "user_id", Target: "public.users", TargetKey: "id", Column: "total_likes", Sum: "likes_count"},
		{Name: "post_last", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "last_like", Max: "created_at"},
		{Name: "post_first", Source: "public.likes", Key: "post_id", Target: "public.posts", TargetKey: "id", Column: "first_like", Min: "created_at"},
		{Name: "user_votes", Source: "public.votes", Key: "post_id", Target: "public.users", TargetKey: "id", Column: "votes",
			Through: &counter.Through{Table: "public.posts", Key: "id", Column: "creator_id"}},
	})
}

func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET %s: %d, body %q: %v", path, rec.Code, rec.Body, err)
	}
	return rec.Code, body
}

// TestInexactKindsRefused: a read of a kind design §7 (f) cannot answer
// exactly at its LSN is a 422 naming the kind, before any connection is
// used (the Reader here has none: a read that went further would panic).
func TestInexactKindsRefused(t *testing.T) {
	t.Parallel()
	cs := testCounters()
	h := New(Options{Counters: cs}).Handler()
	want := map[string]string{
		"user_likes": "multi-level", "post_last": "max", "post_first": "min", "user_votes": "via",
	}
	for _, c := range cs {
		if c.Through != nil && c.Through.Counter == "user_votes" && c.Through.Role != "" {
			want[c.Name] = "via" // the via table's own counters
		}
	}
	if len(want) < 6 {
		t.Fatalf("the via counter expanded into %d counters of its via table", len(want)-4)
	}
	for name, kind := range want {
		for _, path := range []string{"/v1/counters/" + name + "/7", "/v1/counters/" + name + "?keys=7,8"} {
			code, body := get(t, h, path)
			msg := "fresh reads of " + kind + " counters are not exact yet; read the column"
			if code != http.StatusUnprocessableEntity || body["error"] != msg {
				t.Errorf("GET %s = %d %v, want 422 %q", path, code, body, msg)
			}
		}
	}
	// The exact kinds are not refused.
	for _, c := range cs {
		kind := InexactKind(c, cs)
		if _, refused := want[c.Name]; refused != (kind != "") {
			t.Errorf("counter %s: InexactKind %q", c.Name, kind)
		}
	}
}

// TestReadsRefusedBeforeReading: an unknown counter is a 404 and more than
// MaxKeys keys a 400, both before any connection is used.
func TestReadsRefusedBeforeReading(t *testing.T) {
	t.Parallel()
	h := New(Options{Counters: testCounters()}).Handler()
	for _, path := range []string{"/v1/counters/nope/1", "/v1/counters/nope?keys=1,2"} {
		if code, body := get(t, h, path); code != http.StatusNotFound || !strings.Contains(body["error"].(string), `"nope"`) {
			t.Errorf("GET %s = %d %v, want 404 naming the counter", path, code, body)
		}
	}
	keys := make([]string, MaxKeys+1)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	path := "/v1/counters/post_likes?keys=" + strings.Join(keys, ",")
	if code, body := get(t, h, path); code != http.StatusBadRequest || !strings.Contains(body["error"].(string), "at most 1000") {
		t.Errorf("GET with %d keys = %d %v, want 400", len(keys), code, body)
	}
	if code, body := get(t, h, "/v1/counters/post_likes?keys="); code != http.StatusBadRequest {
		t.Errorf("GET with no keys = %d %v, want 400", code, body)
	}
}
