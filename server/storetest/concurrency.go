package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/server"
)

const goroutines = 200

var concurrencyTests = []test{
	{"ManyClaimsOfOneKeyHaveOneWinner", func(t *testing.T, s server.Store) {
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			mu     sync.Mutex
			wins   int
			tokens = map[int64]bool{}
			errs   []error
		)
		for range goroutines {
			wg.Go(func() {
				<-start
				res, err := s.Claim(ctx, claimAt("", "hot", "fp", t0))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				if res.Claimed {
					wins++
				}
				tokens[res.Entry.Token] = true
			})
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		assert.Equal(t, 1, wins, "exactly one of %d concurrent claims must win", goroutines)
		assert.Len(t, tokens, 1, "every loser must see the winner's entry")
	}},
	{"ManyTakeOversOfOneStaleKeyHaveOneWinner", func(t *testing.T, s server.Store) {
		dead := mustClaim(t, s, claimAt("", "hot", "fp", t0))
		later := t0.Add(2 * lockTimeout)
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
			wins  []int64
		)
		for range goroutines {
			wg.Go(func() {
				<-start
				res, err := s.Claim(ctx, claimAt("", "hot", "fp", later))
				assert.NoError(t, err)
				if res.Claimed {
					mu.Lock()
					wins = append(wins, res.Token)
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		require.Len(t, wins, 1, "exactly one request may take a stale key over")
		assert.NotEqual(t, dead.Token, wins[0])
	}},
	{"ManyKeysAtOnce", func(t *testing.T, s server.Store) {
		var wg sync.WaitGroup
		for i := range goroutines {
			wg.Go(func() {
				key := fmt.Sprint("k", i)
				res, err := s.Claim(ctx, claimAt("", key, "fp", t0))
				if !assert.NoError(t, err) || !assert.True(t, res.Claimed) {
					return
				}
				assert.NoError(t, s.Complete(ctx, complete("", key, res.Token, response(key), t0)))
			})
		}
		wg.Wait()
		for i := range goroutines {
			key := fmt.Sprint("k", i)
			assert.Equal(t, key, string(mustGet(t, s, "", key, t0).Response.Body))
		}
	}},
}
