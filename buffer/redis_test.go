package buffer_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/buffer/buffertest"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestContractSingleNode runs the buffer contract against one redis-server,
// through a client made as walcount makes its own.
func TestContractSingleNode(t *testing.T) {
	t.Parallel()
	buffertest.Run(t, func(t *testing.T) redis.UniversalClient {
		return topologyClient(testenv.RedisURL(t), redisconn.TLSOptions{})(t)
	})
}

func TestKeysShareAHashTag(t *testing.T) {
	k := buffer.KeysFor("walcount")
	for _, key := range k.All() {
		if want := "walcount:{walcount}:"; key[:len(want)] != want {
			t.Errorf("key %q lacks the hash tag prefix %q", key, want)
		}
	}
}

func TestLSNFormatSortsLikeLSNs(t *testing.T) {
	a, b := buffer.FormatLSN(0x9_00000000), buffer.FormatLSN(0x10_00000000)
	if !(a < b) {
		t.Fatalf("%s !< %s", a, b)
	}
	if l, err := buffer.ParseLSN(buffer.FormatLSN(0xFFFF_FFFF_FFFF_FFFE)); err != nil || l != 0xFFFF_FFFF_FFFF_FFFE {
		t.Fatalf("round trip: %s, %v", l, err)
	}
}
