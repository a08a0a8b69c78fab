package postgres_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/postgres/internal/pgproxy"
	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Forty creates at once share commits; the reply of the first COMMIT is
// lost. Each create answered without error is stored and is its caller's.
func TestGroupOfCreatesWhoseAcknowledgementIsLostEachGetsItsAnswer(t *testing.T) {
	t.Parallel()
	p, j, direct := proxiedJournal(t)
	const n = 40
	var wg sync.WaitGroup
	type out struct {
		created bool
		err     error
	}
	outs := make([]out, n)
	keys := make([]string, n)
	f := p.DropReply(commitsWrite)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		rec := newRecord("shop")
		keys[i] = rec.Key
		go func() {
			defer wg.Done()
			<-start
			_, c, err := j.Create(ctx, rec)
			outs[i] = out{c, err}
		}()
	}
	close(start)
	wg.Wait()
	fired(t, f)
	for i, o := range outs {
		_, gerr := direct.Get(ctx, keys[i])
		if o.err != nil {
			t.Logf("%d: err=%v stored=%v", i, o.err, gerr == nil)
			continue
		}
		require.NoError(t, gerr, "create %d answered ok but is not stored", i)
		assert.True(t, o.created, "create %d", i)
	}
}

// Forty claims at once, two per key, share inserts; the reply of the
// first is lost. Of each pair answered without error exactly one claims.
func TestGroupOfClaimsWhoseAcknowledgementIsLostOneClaimsEachKey(t *testing.T) {
	t.Parallel()
	p, pool := proxiedPool(t)
	schema := pgtest.Schema(t)
	s := openStoreIn(t, pool, schema)
	const n = 40
	var wg sync.WaitGroup
	claimed := make([]bool, n)
	errs := make([]error, n)
	f := p.DropReply(pgproxy.Executes("INSERT INTO", "store_entries"))
	start := make(chan struct{})
	now := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Pairs share a key: exactly one of each pair claims it.
			res, err := s.Claim(ctx, claimAt(fmt.Sprint("k", i/2), "fp", now))
			claimed[i], errs[i] = res.Claimed, err
		}()
	}
	close(start)
	wg.Wait()
	fired(t, f)
	for i := 0; i < n; i += 2 {
		if errs[i] != nil || errs[i+1] != nil {
			t.Logf("pair %d: %v / %v", i/2, errs[i], errs[i+1])
			continue
		}
		assert.True(t, claimed[i] != claimed[i+1], "pair %d: claimed %v and %v", i/2, claimed[i], claimed[i+1])
	}
}
