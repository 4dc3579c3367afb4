package preflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
)

// CheckRedisShared is the check that no walcount of another PostgreSQL
// cluster keeps the slot's keys in the same Redis.
const CheckRedisShared = "redis_shared"

// checkSharedBuffer reports the slot's Redis keys kept by the walcount of
// another cluster (another system identifier) as a Problem of the
// configuration: two deployments with one Redis and one slot name reset
// each other's buffers. walcount run refuses to start on it.
func (r *run) checkSharedBuffer(ctx context.Context, client redis.UniversalClient) {
	if r.history == "" {
		return // the replication connection's finding says why
	}
	err := buffer.New(client, r.cfg.Slot).CheckOwner(ctx, r.history, time.Now())
	var other *buffer.OtherDeploymentError
	switch {
	case errors.As(err, &other):
		r.configProblem(CheckRedisShared, fmt.Sprintf("the Redis keys of slot %s are kept by the walcount of another PostgreSQL cluster "+
			"(system identifier %s, last seen %s ago; this server's is %s): two deployments share this Redis and slot name, and each would reset the other's buffer",
			r.cfg.Slot, other.Theirs, other.Age.Round(time.Second), other.Ours),
			fmt.Sprintf("give this deployment its own slot name (--slot, WALCOUNT_SLOT or slot, then walcount setup) or its own Redis database "+
				"(redis_url redis://host:6379/N); if that cluster is gone for good (this cluster before a pg_upgrade or a restore included), wait %s after its walcount stopped (a walcount stopped cleanly leaves no wait)", buffer.AliveStale))
	case err != nil:
		r.problem(CheckRedisShared, fmt.Sprintf("cannot read the owner of the Redis buffer: %v", err), "")
	default:
		r.ok(CheckRedisShared, fmt.Sprintf("no walcount of another PostgreSQL cluster keeps slot %s's Redis keys", r.cfg.Slot))
	}
}
