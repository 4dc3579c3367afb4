package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Shape of the demo traffic.
const (
	// zipfS is the Zipf exponent of post popularity: post 1 is the most
	// liked, post 2 about half as much, and so on.
	zipfS = 1.1
	// viralShare is the fraction of operations that go to the viral post
	// on top of the Zipf traffic.
	viralShare = 0.2
	// Out of 100 operations: likes, unlikes; the rest like 2-5 posts in
	// one multi-row INSERT (one transaction, several rows).
	pctLike   = 65
	pctUnlike = 25
	// maxUsers is the range of user ids.
	maxUsers = 1_000_000
	// opTimeout bounds one app operation.
	opTimeout = 30 * time.Second
)

// ViralPost returns the id of the viral post among posts 1..posts: one in
// the middle, so that it visibly climbs past the Zipf head.
func ViralPost(posts int) int64 { return int64(posts/2 + 1) }

// load is the demo's app: clients that like and unlike posts as fast as
// the database lets them. Its counters are safe for concurrent use.
type load struct {
	db    *pgxpool.Pool
	posts int
	viral int64

	likes   atomic.Int64 // rows inserted by committed statements
	unlikes atomic.Int64 // rows deleted by committed statements
	txns    atomic.Int64 // committed transactions
	errs    atomic.Int64 // failed operations

	errMu   sync.Mutex
	lastErr error
}

func newLoad(db *pgxpool.Pool, posts int) *load {
	return &load{db: db, posts: posts, viral: ViralPost(posts)}
}

// run runs clients until ctx is done and returns when all have stopped.
func (l *load) run(ctx context.Context, clients int) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { l.client(ctx, uint64(c)+1) })
	}
	wg.Wait()
}

func (l *load) client(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	zipf := rand.NewZipf(rng, zipfS, 1, uint64(l.posts-1))
	post := func() int64 {
		if rng.Float64() < viralShare {
			return l.viral
		}
		return int64(zipf.Uint64()) + 1
	}
	// Clients stop between operations, never in the middle of one: a
	// statement cancelled after its commit would go uncounted, and the
	// app's totals must add up to the rows.
	opCtx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(opCtx, opTimeout)
		err := l.op(octx, rng, post)
		cancel()
		if err == nil {
			l.txns.Add(1)
			continue
		}
		l.errs.Add(1)
		l.errMu.Lock()
		l.lastErr = err
		l.errMu.Unlock()
	}
}

// op performs one random operation in its own transaction.
func (l *load) op(ctx context.Context, rng *rand.Rand, post func() int64) error {
	switch k := rng.IntN(100); {
	case k < pctLike:
		tag, err := l.db.Exec(ctx, insertLike, post(), rng.Int64N(maxUsers))
		if err != nil {
			return fmt.Errorf("like: %w", err)
		}
		l.likes.Add(tag.RowsAffected())
	case k < pctLike+pctUnlike:
		// SKIP LOCKED: concurrent unlikes of the viral post pick
		// different rows instead of queueing on the same one.
		tag, err := l.db.Exec(ctx, deleteLike, post())
		if err != nil {
			return fmt.Errorf("unlike: %w", err)
		}
		l.unlikes.Add(tag.RowsAffected())
	default:
		n := 2 + rng.IntN(4)
		ids := make([]int64, n)
		users := make([]int64, n)
		for i := range ids {
			ids[i], users[i] = post(), rng.Int64N(maxUsers)
		}
		tag, err := l.db.Exec(ctx, insertLikes, ids, users)
		if err != nil {
			return fmt.Errorf("like several: %w", err)
		}
		l.likes.Add(tag.RowsAffected())
	}
	return nil
}

// err returns the last failure, or nil.
func (l *load) err() error {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	return l.lastErr
}

var (
	likes       = pgx.Identifier{Schema, "likes"}.Sanitize()
	insertLike  = `INSERT INTO ` + likes + ` (post_id, user_id) VALUES ($1, $2)`
	insertLikes = `INSERT INTO ` + likes + ` (post_id, user_id) SELECT * FROM unnest($1::bigint[], $2::bigint[])`
	deleteLike  = `DELETE FROM ` + likes + ` WHERE id = (SELECT id FROM ` + likes +
		` WHERE post_id = $1 LIMIT 1 FOR UPDATE SKIP LOCKED)`
)

// errNoPosts is returned for a demo without posts.
var errNoPosts = errors.New("the demo needs at least 2 posts")
