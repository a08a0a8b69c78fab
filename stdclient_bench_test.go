package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem"
)

// BenchmarkStandardClient compares, in the same run, one operation sent
// with Do and the same operation sent through StandardClient (a request
// an SDK would build: a JSON body, its own Authorization and
// Idempotency-Key, the answer read through resp.Body), on the SQLite
// journal and on a MemoryJournal (the client's own cost, where the
// standard client's share is largest). cpu-µs/op is the figure the
// overhead is judged by.
//
//	go test -run '^$' -bench 'StandardClient$' -benchtime 5000x .
//
// with the same b.N for both (a MemoryJournal keeps its records, so an
// operation costs more the more the run has made); BENCHMARKS.md says how
// the figures are taken, in alternating processes.
func BenchmarkStandardClient(b *testing.B) {
	for _, journal := range []string{"memory", "sqlite"} {
		for _, callers := range []int{1, 16} {
			for _, via := range []string{"Do", "StandardClient"} {
				b.Run(fmt.Sprintf("%s/callers=%d/%s", journal, callers, via), func(b *testing.B) {
					benchStandardClient(b, journal, callers, via == "StandardClient")
				})
			}
		}
	}
}

func benchStandardClient(b *testing.B, journal string, callers int, std bool) {
	srv := benchServer(b)
	var j idem.Journal = idem.NewMemoryJournal()
	if journal == "sqlite" {
		sj, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "ops.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer sj.Close()
		j = sj
	}
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, HTTPClient: &http.Client{Transport: benchTransport()},
		Authorize: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer token"); return nil }})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	hc := c.StandardClient()
	url := srv.URL + "/orders"
	runConcurrent(b, callers, func(i int64) error {
		id := fmt.Sprint("checkout/cart-", i)
		if !std {
			res, err := c.Do(context.Background(), idem.Op{ID: id, URL: "/orders", Body: benchBody,
				Header: http.Header{"Content-Type": {"application/json"}}})
			if err != nil {
				return err
			}
			if res.StatusCode != http.StatusCreated {
				return fmt.Errorf("status %d", res.StatusCode)
			}
			return nil
		}
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), id), http.MethodPost, url,
			bytes.NewReader(benchBody))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer token")
		req.Header.Set("Idempotency-Key", id)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}
