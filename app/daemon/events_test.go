package daemon

import (
	"context"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/events"
)

// assertEventsMatchColumns reads the default counter's change events
// stream: each key's entries are in LSN order, and the last one of every
// post whose column is not 0 carries that column (at least one entry per
// change, the last with the value after it). Call it once the posts are
// exact and nothing is carried.
func (e *env) assertEventsMatchColumns() {
	e.t.Helper()
	ctx := context.Background()
	opt, err := redis.ParseURL(e.redis.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	stream := events.Stream(e.cfg.Slot, counter.Default().Name)
	last := map[string]string{}
	at := map[string]pglogrepl.LSN{}
	entries := 0
	for from := "-"; ; {
		msgs, err := rdb.XRangeN(ctx, stream, from, "+", 10000).Result()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, m := range msgs {
			key, _ := m.Values["key"].(string)
			if key == "" {
				continue // a gap entry
			}
			entries++
			s, _ := m.Values["lsn"].(string)
			l, err := pglogrepl.ParseLSN(s)
			if err != nil {
				e.t.Fatalf("entry %s: %v", m.ID, err)
			}
			if l < at[key] {
				e.t.Errorf("entry %s: key %s at %s after an entry at %s", m.ID, key, l, at[key])
			}
			at[key], last[key] = l, m.Values["value"].(string)
		}
		if len(msgs) < 10000 {
			break
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
	rows, err := e.db.Query(ctx, "SELECT id, likes_count FROM posts WHERE likes_count <> 0")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var posts, missing int
	for rows.Next() {
		var id, n int64
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		posts++
		if got, ok := last[strconv.FormatInt(id, 10)]; !ok || got != strconv.FormatInt(n, 10) {
			if missing++; missing <= 5 {
				e.t.Errorf("post %d: column %d, last change event %q (found %v)", id, n, got, ok)
			}
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	if missing > 0 {
		e.t.Errorf("%d of %d posts without their column's change event (%d entries)", missing, posts, entries)
	}
	e.t.Logf("%d change events; every one of %d posts has its column's", entries, posts)
}
